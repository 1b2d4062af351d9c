#include "broker/server/core/heap_trim.hpp"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

namespace mpsshim::server {

std::uint64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (read != 2) return 0;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

std::uint64_t HeapTrimmer::maybe_trim(std::chrono::steady_clock::time_point now) {
  const std::uint64_t freed = freed_.load(std::memory_order_relaxed);
  if (freed == freed_at_last_trim_ || now - last_trim_ < kMinInterval) return 0;
  freed_at_last_trim_ = freed;
  last_trim_ = now;
  ++trims_;
  const std::uint64_t before = resident_bytes();
  ::malloc_trim(0);
  const std::uint64_t after = resident_bytes();
  return before > after ? before - after : 0;
}

}  // namespace mpsshim::server

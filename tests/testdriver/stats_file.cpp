// For tests that watch a test driver loaded by another process (the e2e and hostile-client
// suites watch the one inside mpsshim-server): with MPSSHIM_TESTDRIVER_STATS_FILE=PATH, cuInit
// starts a thread that rewrites PATH every 20 ms with one line
// `live_objects=N device_bytes=B`: the objects a leak would leave (State::live_objects) and the
// bytes of device memory allocated (cuMemAlloc's and physical VMM allocations). Written to PATH.tmp
// and renamed, so a reader never sees half a line.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

std::size_t device_bytes(State& s) {
  std::lock_guard lock(s.mutex);
  std::size_t bytes = 0;
  for (const auto& [base, allocation] : s.allocations) bytes += allocation.size;
  // The server's cuMemAlloc memory lives in physical VMM allocations (its address arena).
  for (const auto& [handle, physical] : s.vmm.physical) {
    if (!physical.imported) bytes += physical.size;
  }
  return bytes;
}

void write_stats(State& s, const std::string& path) {
  const std::string temporary = path + ".tmp";
  FILE* f = std::fopen(temporary.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "live_objects=%d device_bytes=%zu\n", s.live_objects(), device_bytes(s));
  std::fclose(f);
  std::rename(temporary.c_str(), path.c_str());
}

}  // namespace

void start_stats_file(State& s) {
  const char* path = std::getenv("MPSSHIM_TESTDRIVER_STATS_FILE");
  if (path == nullptr || *path == '\0') return;
  std::thread([&s, file = std::string(path)] {
    while (!s.forked.load()) {
      write_stats(s, file);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }).detach();
}

}  // namespace mpsshim::testdriver

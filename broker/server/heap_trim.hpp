// Gives the heap that finished sessions left behind back to the system.
//
// Why: the driver allocates host memory for what a client loads (a PyTorch client's ~300 MB of
// fat binaries become ~1.2 GB of the server's RSS on an H100, driver 580) and frees it when the
// client's libraries are unloaded, but glibc keeps freed memory in the arena of the thread that
// freed it, and a server has a worker thread per CPU. A server whose clients come and go then
// holds the high-water mark of every arena for its whole life. malloc_trim(0) returns the free
// pages of every arena (madvise), keeping the mappings.
//
// Who calls what: workers call session_freed() (any thread, lock-free); only the coordinator
// thread calls maybe_trim(), which trims at most once per kMinInterval and only after a session
// was freed since the last trim, so a server with stable clients never trims.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace mpsshim::server {

class HeapTrimmer {
 public:
  static constexpr auto kMinInterval = std::chrono::seconds(2);

  void session_freed() { freed_.fetch_add(1, std::memory_order_relaxed); }

  // Coordinator thread only. Returns the bytes of resident memory the trim gave back (0 when it
  // did not trim, or the RSS did not fall).
  std::uint64_t maybe_trim(std::chrono::steady_clock::time_point now);

  std::uint64_t trims() const { return trims_; }

 private:
  std::atomic<std::uint64_t> freed_{0};
  std::uint64_t freed_at_last_trim_ = 0;  // coordinator only, as are the two below
  std::chrono::steady_clock::time_point last_trim_{};
  std::uint64_t trims_ = 0;
};

// This process's resident set in bytes (/proc/self/statm), 0 when it cannot be read.
std::uint64_t resident_bytes();

}  // namespace mpsshim::server

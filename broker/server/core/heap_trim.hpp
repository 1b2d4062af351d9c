// Gives the heap that finished sessions left behind back to the system.
//
// Why: the driver allocates host memory for what clients load (the first PyTorch client grew
// the server by ~1.2 GiB on an H100, driver 580) and frees it from whichever worker thread
// unloads it, but glibc keeps freed memory in that thread's arena, and a server has a worker
// per CPU: without a trim the server keeps the high-water mark of every arena. malloc_trim(0)
// returns the free pages of every arena (madvise), keeping the mappings. Measured: after a GPU
// soak, one trim gave 6.4 GiB back when the last client left; trims while clients were
// connected gave back little (docs/benchmarks.md, "Where the soak's memory goes").
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
  // Something else gave memory back (a kept library unloaded): trim as after a session.
  void memory_freed() { freed_.fetch_add(1, std::memory_order_relaxed); }

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

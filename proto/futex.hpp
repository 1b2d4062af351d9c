// Cross-process futex wait/wake on 32-bit words in shared memory (never FUTEX_PRIVATE: the
// waiter and the waker live in different processes).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <ctime>

namespace mpsshim::proto {

// Sleeps while *word == expected, at most timeout_ns (0 = no limit). Returns false on timeout.
inline bool futex_wait(const void* word, std::uint32_t expected, std::uint64_t timeout_ns = 0) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns != 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000u);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000u);
    tsp = &ts;
  }
  long rc = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, nullptr, 0);
  return !(rc == -1 && errno == ETIMEDOUT);
}

inline void futex_wake(const void* word, int count = INT32_MAX) {
  syscall(SYS_futex, word, FUTEX_WAKE, count, nullptr, nullptr, 0);
}

// The low half of a little-endian 64-bit position: futexes are 32-bit, ring positions 64-bit.
inline const void* low_word(const std::atomic<std::uint64_t>& position) {
  static_assert(sizeof(std::atomic<std::uint64_t>) == 8);
  return &position;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace mpsshim::proto

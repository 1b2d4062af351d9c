#include "libshim/copy_pool.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/log.hpp"
#include "libshim/cpu_budget.hpp"
#include "proto/futex.hpp"

namespace mpsshim::shim {
namespace {

using Clock = std::chrono::steady_clock;

// How long a helper looks for the next job before it sleeps: the pieces of one large copy come
// microseconds apart, and a woken helper starts ~10 us late.
constexpr auto kHelperSpin = std::chrono::microseconds(200);
constexpr int kMaxThreads = 64;

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

int default_threads() {
  return std::clamp(usable_cpus() / 4, 1, 4);
}

int read_copy_threads() {
  const char* value = std::getenv("MPSSHIM_COPY_THREADS");
  if (value == nullptr || *value == '\0') return default_threads();
  char* end = nullptr;
  const long threads = std::strtol(value, &end, 10);
  if (*end != '\0' || threads < 1 || threads > kMaxThreads) {
    log_warn("MPSSHIM_COPY_THREADS={}: expected 1 to {}; using {}", value, kMaxThreads,
             default_threads());
    return default_threads();
  }
  return static_cast<int>(threads);
}

// The job word: bit 63 open (helpers may enter), bits 32-62 the job's number, bits 0-31 how
// many helpers entered it and have not left. The caller rewrites the job only while it is closed
// and nobody is inside, so a helper never reads a job that is being rewritten.
constexpr std::uint64_t kOpen = std::uint64_t{1} << 63;
constexpr std::uint64_t kEnteredMask = 0xffffffffu;
constexpr std::uint64_t job_number(std::uint64_t word) {
  return (word & ~kOpen) >> 32;
}

class Pool {
 public:
  explicit Pool(int helpers) : owner_(::getpid()) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  // the application's handlers never run here
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, std::size_t{256} << 10);
    for (int i = 0; i < helpers; ++i) {
      pthread_t thread;
      if (int rc = pthread_create(&thread, &attr, &Pool::helper_main, this); rc != 0) {
        log_warn("cannot start a copy helper thread (error {}); {} of {} running", rc, i, helpers);
        break;
      }
      pthread_setname_np(thread, "mpsshim-copy");
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }

  // False (nothing copied) when another thread holds the pool or this is a forked child.
  bool try_copy(std::byte* dst, const std::byte* src, std::size_t bytes, CopyFunction copy) {
    if (::getpid() != owner_) return false;
    if (taken_.test_and_set(std::memory_order_acquire)) return false;
    // Helpers of the last job may still be on their way out (they found no part left).
    while ((word_.load(std::memory_order_acquire) & kEnteredMask) != 0) cpu_relax();
    job_ = {dst, src, bytes, (bytes + kCopyPartBytes - 1) / kCopyPartBytes, copy};
    next_part_.store(0, std::memory_order_relaxed);
    parts_done_.store(0, std::memory_order_relaxed);
    number_ = number_ % 0x7fffffff + 1;  // 1 .. 2^31-1: a helper's "none yet" is 0
    word_.store(kOpen | (number_ << 32), std::memory_order_seq_cst);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) != 0) proto::futex_wake(&wake_);
    run_parts();
    while (parts_done_.load(std::memory_order_acquire) != job_.parts) cpu_relax();
    word_.fetch_and(~kOpen, std::memory_order_acq_rel);
    taken_.clear(std::memory_order_release);
    return true;
  }

 private:
  struct Job {
    std::byte* dst;
    const std::byte* src;
    std::size_t bytes;
    std::size_t parts;
    CopyFunction copy;
  };

  static void* helper_main(void* self) {
    static_cast<Pool*>(self)->helper_loop();
    return nullptr;
  }

  void run_parts() {
    for (;;) {
      const std::size_t part = next_part_.fetch_add(1, std::memory_order_relaxed);
      if (part >= job_.parts) return;
      const std::size_t begin = part * kCopyPartBytes;
      job_.copy(job_.dst + begin, job_.src + begin, std::min(kCopyPartBytes, job_.bytes - begin));
      parts_done_.fetch_add(1, std::memory_order_release);
    }
  }

  bool job_waiting(std::uint64_t word, std::uint64_t last) const {
    return (word & kOpen) != 0 && job_number(word) != last;
  }

  void helper_loop() {
    std::uint64_t last = 0;  // the number of the last job this helper entered
    auto idle_since = Clock::now();
    for (;;) {
      std::uint64_t word = word_.load(std::memory_order_acquire);
      if (job_waiting(word, last)) {
        if (word_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) {
          last = job_number(word);
          run_parts();
          word_.fetch_sub(1, std::memory_order_release);
          idle_since = Clock::now();
        }
        continue;
      }
      if (Clock::now() - idle_since < kHelperSpin) {
        cpu_relax();
        continue;
      }
      // Sleep. A job opened after the look below bumps wake_ first (so the wait returns at
      // once) or sees this sleeper and wakes it.
      const std::uint32_t seen = wake_.load(std::memory_order_seq_cst);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (!job_waiting(word_.load(std::memory_order_seq_cst), last))
        proto::futex_wait(&wake_, seen);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      idle_since = Clock::now();
    }
  }

  const pid_t owner_;
  std::atomic_flag taken_ = ATOMIC_FLAG_INIT;
  std::atomic<std::uint64_t> word_{0};
  std::atomic<std::uint32_t> wake_{0};  // futex word, bumped by every job
  std::atomic<std::uint32_t> sleepers_{0};
  std::atomic<std::size_t> next_part_{0};
  std::atomic<std::size_t> parts_done_{0};
  Job job_{};                 // written by the caller holding taken_, read by entered helpers
  std::uint64_t number_ = 0;  // the caller's (under taken_)
};

}  // namespace

int copy_threads() {
  static const int threads = read_copy_threads();
  return threads;
}

void parallel_copy(std::byte* dst, const std::byte* src, std::size_t bytes, CopyFunction copy) {
  if (bytes >= kParallelMinBytes && copy_threads() > 1) {
    // Never destroyed: detached helpers use it until the process ends.
    static Pool* const pool = new Pool(copy_threads() - 1);
    if (pool->try_copy(dst, src, bytes, copy)) return;
  }
  copy(dst, src, bytes);
}

}  // namespace mpsshim::shim

// How a thread that waits for the server spends the wait: a synchronize, a blocking copy, any
// call with an answer. The real driver spins while a host thread synchronizes (the default
// CU_CTX_SCHED_AUTO spins when the process has fewer contexts than CPUs), so a program that
// waits natively never sleeps. A futex sleep costs a wake-up on the way back (~3.5 us on bare
// metal, more inside a VM whose idle vCPU halted), and that is added to every synchronize,
// every pinned copy and every cycle of a launch-and-synchronize loop.
//
// The plan follows the calling thread's current context's scheduling flags (cuCtxSetFlags,
// cuDevicePrimaryCtxSetFlags, cudaSetDeviceFlags):
//   CU_CTX_SCHED_SPIN           spin until the answer comes
//   CU_CTX_SCHED_YIELD          spin, yielding the CPU (sched_yield) between looks
//   CU_CTX_SCHED_BLOCKING_SYNC  a short spin, then sleep on the futex
//   CU_CTX_SCHED_AUTO (default) spin a while, yield for up to MPSSHIM_WAIT_SPIN_US in all,
//                               then sleep; while the server says it is crowded (more
//                               clients than it lets spin, mpsshim-server --spin-clients),
//                               sleep after the short spin: 32 clients yielding on 16 CPUs
//                               took the CPU the server's workers issue their work with
//                               (small_kernels x 32 on an H100: 0.81 M kernels/s spinning,
//                               1.48 M sleeping; docs/benchmarks.md)
// AUTO and BLOCKING_SYNC waits are paced (wait_pacer.hpp): a call whose last waits all took long
// sleeps through most of the next one first. On a crowded server AUTO's too, but only while it
// has no more clients than CPUs, and the paced sleep is followed by a spin of up to half its
// length: the short spin would end before the call's usual end, and a sleeping thread watches
// nothing (the worker then polls for its answer, in 100 us naps while crowded). Two clients of
// 2 ms kernels beside 8 of 10 us kernels on an H200 got their answers 76-85 us after their
// kernels' last block ended (medians over their fastest), 9.5-11 us paced; NVIDIA MPS's 2.5-4.2
// (docs/benchmarks.md, "Concurrency and mixed sizes").
// Every plan looks at the server's socket every kPeerCheck while it spins, so a server that
// died is noticed as it is while sleeping.
#pragma once

#include <chrono>
#include <cstdint>

namespace mpsshim::shim {

struct WaitPlan {
  // Spin with a pause instruction this long first: a launch + synchronize round trip.
  std::chrono::nanoseconds busy;
  // Then spin with sched_yield between looks until this much time has passed since the wait
  // began; nanoseconds::max(): never sleep.
  std::chrono::nanoseconds spin_total;
  // Whether a wait whose call took long its last few times sleeps first (wait_pacer.hpp):
  // not where the context asked to spin or to yield.
  bool paced = false;
  // Whether a wait that did sleep first then spins for up to half the sleep instead of `busy`
  // and `spin_total` (a crowded server's AUTO waits).
  bool spin_after_sleep = false;
};

// After a paced sleep of `slept`, the plan for the rest of the wait.
WaitPlan after_paced_sleep(WaitPlan plan, std::chrono::nanoseconds slept);

// The busy spin of every plan: longer than a typical launch + synchronize round trip.
inline constexpr std::chrono::nanoseconds kBusySpin = std::chrono::microseconds(60);
// How often a spinning waiter checks that the server is still there.
inline constexpr std::chrono::nanoseconds kPeerCheck = std::chrono::milliseconds(20);
// The default yield budget of CU_CTX_SCHED_AUTO (MPSSHIM_WAIT_SPIN_US overrides it).
inline constexpr std::chrono::nanoseconds kDefaultSpinTotal = std::chrono::milliseconds(20);

// The plan for a context with these flags (only the CU_CTX_SCHED_MASK bits matter), where AUTO
// spins for `auto_spin_total` in all, or only the busy spin while the server is crowded
// (`crowded`: proto::SessionControl::crowded).
WaitPlan wait_plan_for(unsigned context_flags, std::chrono::nanoseconds auto_spin_total,
                       std::uint32_t crowded = 0);

// MPSSHIM_WAIT_SPIN_US as microseconds; unset or empty: kDefaultSpinTotal, which a malformed
// value also gives (with a warning in the log).
std::chrono::nanoseconds parse_wait_spin_us(const char* text);
// The process's AUTO spin: MPSSHIM_WAIT_SPIN_US, read once.
std::chrono::nanoseconds auto_spin_total();

// The plan for the calling thread: its current context's flags (AUTO without one),
// auto_spin_total() and the server's crowded hint. In context.cpp, which knows the thread's
// current context.
WaitPlan current_wait_plan(std::uint32_t crowded);

}  // namespace mpsshim::shim

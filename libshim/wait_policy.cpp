#include "libshim/wait_policy.hpp"

#include <cuda.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/log.hpp"
#include "proto/segment.hpp"

namespace mpsshim::shim {

std::chrono::nanoseconds parse_wait_spin_us(const char* text) {
  if (text == nullptr || *text == '\0') return kDefaultSpinTotal;
  char* end = nullptr;
  errno = 0;
  const unsigned long long us = std::strtoull(text, &end, 10);
  // At most an hour: a longer spin is a spin without end, which CU_CTX_SCHED_SPIN asks for.
  if (*end != '\0' || errno != 0 || text[0] == '-' || text[0] == '+' || text[0] == ' ' ||
      us > 3'600'000'000ull) {
    log_warn(
        "ignoring MPSSHIM_WAIT_SPIN_US='{}': expected microseconds from 0 to 3600000000; "
        "waiting threads spin for {} us before they sleep",
        text, std::chrono::duration_cast<std::chrono::microseconds>(kDefaultSpinTotal).count());
    return kDefaultSpinTotal;
  }
  return std::chrono::microseconds(us);
}

std::chrono::nanoseconds auto_spin_total() {
  static const std::chrono::nanoseconds total =
      parse_wait_spin_us(std::getenv("MPSSHIM_WAIT_SPIN_US"));
  return total;
}

WaitPlan wait_plan_for(unsigned context_flags, std::chrono::nanoseconds auto_spin,
                       std::uint32_t crowded) {
  constexpr auto forever = std::chrono::nanoseconds::max();
  switch (context_flags & CU_CTX_SCHED_MASK) {
    case CU_CTX_SCHED_SPIN:
      return {forever, forever};
    case CU_CTX_SCHED_YIELD:
      return {std::chrono::nanoseconds(0), forever};
    case CU_CTX_SCHED_BLOCKING_SYNC:
      return {kBusySpin, kBusySpin, true};
    default:  // CU_CTX_SCHED_AUTO
      // Past the CPUs not paced: a paced sleep on a machine with more runnable threads than
      // CPUs wakes late (32 small_kernels clients on an H200: 1.28-1.52 M kernels/s paced,
      // 1.44-1.64 M not).
      if (crowded >= proto::kCrowdedPastCpus) return {kBusySpin, kBusySpin, false};
      if (crowded != 0) return {kBusySpin, kBusySpin, true, true};
      return {kBusySpin, std::max(kBusySpin, auto_spin), true};
  }
}

WaitPlan after_paced_sleep(WaitPlan plan, std::chrono::nanoseconds slept) {
  if (!plan.spin_after_sleep || slept <= std::chrono::nanoseconds(0)) return plan;
  // The sleep was three quarters of the call's shortest recent wait less a wake-up margin
  // (wait_pacer.hpp): the rest is expected within about a third of it.
  plan.busy = plan.spin_total = std::max(kBusySpin, slept / 2);
  return plan;
}

}  // namespace mpsshim::shim

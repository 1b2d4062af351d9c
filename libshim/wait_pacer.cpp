#include "libshim/wait_pacer.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <limits>

namespace mpsshim::shim {

std::chrono::nanoseconds WaitPacer::sleep_before(std::uint16_t op) const {
  const Call& call = calls_[op % kCalls];
  if (call.op != op || call.count < kHistory) return std::chrono::nanoseconds(0);
  const std::chrono::microseconds shortest(
      *std::min_element(call.took_us.begin(), call.took_us.end()));
  if (shortest < kPaceFrom) return std::chrono::nanoseconds(0);
  // Three quarters: a wait a little quicker than the shortest so far still ends while spinning.
  return shortest * 3 / 4 - kWakeMargin;
}

void WaitPacer::record(std::uint16_t op, std::chrono::nanoseconds took) {
  Call& call = calls_[op % kCalls];
  if (call.op != op || call.count == 0) call = Call{.op = op};
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
  call.took_us[call.next] = static_cast<std::uint32_t>(
      std::clamp<long long>(us, 0, std::numeric_limits<std::uint32_t>::max()));
  call.next = static_cast<std::uint8_t>((call.next + 1) % kHistory);
  if (call.count < kHistory) ++call.count;
}

void sleep_precisely(std::chrono::nanoseconds duration) {
  if (duration <= std::chrono::nanoseconds(0)) return;
  const int saved_errno = errno;
  // The default slack of 50 us would overrun most of what the sleep saves spinning.
  const int slack = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  timespec left{static_cast<time_t>(duration.count() / 1'000'000'000),
                static_cast<long>(duration.count() % 1'000'000'000)};
  while (::nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
  if (slack > 0) ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack), 0, 0, 0);
  errno = saved_errno;
}

}  // namespace mpsshim::shim

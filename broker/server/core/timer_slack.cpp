#include "broker/server/core/timer_slack.hpp"

#include <sys/prctl.h>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "common/log.hpp"

namespace mpsshim::server {

std::optional<std::chrono::nanoseconds> worker_timer_slack(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string_view value(text);
  if (value == "inherit") return std::nullopt;
  long long ns = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), ns);
  if (error != std::errc() || end != value.data() + value.size() || ns < 1 || ns > 1'000'000'000) {
    log_warn(
        "MPSSHIM_SERVER_TIMER_SLACK=\"{}\" is not nanoseconds (1 to 1000000000) or inherit; "
        "the workers keep the server's slack",
        value);
    return std::nullopt;
  }
  return std::chrono::nanoseconds(ns);
}

std::chrono::nanoseconds set_thread_timer_slack(std::optional<std::chrono::nanoseconds> slack) {
  if (slack &&
      ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack->count()), 0, 0, 0) != 0) {
    log_warn("a worker could not set its timer slack to {} ns: {}", slack->count(),
             std::strerror(errno));
  }
  return std::chrono::nanoseconds(::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0));
}

}  // namespace mpsshim::server

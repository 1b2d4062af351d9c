#include "broker/server/accounting/client_usage.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {
namespace {

// Program names go into blank-separated key=value lines.
std::string one_word(const std::string& name) {
  std::string out = name.empty() ? std::string("-") : name;
  std::replace_if(
      out.begin(), out.end(), [](unsigned char c) { return std::isspace(c) != 0; }, '_');
  return out;
}

// active, suspended (by the operator), preempted (suspended for another client's memory),
// mem-wait (suspended until its own allocation fits) or draining.
const char* state_word(const Session& s) {
  if (s.life.state != SessionState::kActive) return "draining";
  if (!s.suspension.on) return "active";
  if (!s.suspension.by_policy) return "suspended";
  return s.memory_wait.on ? "mem-wait" : "preempted";
}

}  // namespace

std::string format_client_usage(const Session& s) {
  const ClientUsage& u = s.usage;
  const auto started_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(u.started.time_since_epoch()).count();
  return fmt::format(
      "client={} pid={} uid={} program={} sms={} sm_percentage={} mem_used={} mem_peak={} "
      "mem_limit={} pinned={} launches={} busy_us={} h2d_bytes={} d2h_bytes={} d2d_bytes={} "
      "priority={} state={} start_time={}.{:03} allocation={} partition={} held_us={} "
      "sms_held_back={} parked={} suspended_us={}\n",
      s.client.id, s.client.pid, s.client.uid, one_word(s.client.program), s.green.sm_count,
      s.sm.percentage, s.charge.used(), s.charge.peak(), s.charge.limit(), u.pinned_bytes,
      s.launches, s.busy.on ? fmt::format("{}", u.busy_ns / 1000) : std::string("-"), u.bytes_h2d,
      u.bytes_d2h, u.bytes_d2d, s.priority_bias, state_word(s), started_ms / 1000,
      started_ms % 1000, s.charge.allocation() ? s.charge.allocation()->id() : 0,
      s.sm.placement.partition, s.priority.held_us,
      s.green.outside_reserve ? s.green.held_back_sms : 0, s.suspension.parked_bytes,
      std::chrono::duration_cast<std::chrono::microseconds>(
          s.suspension.total(std::chrono::steady_clock::now()))
          .count());
}

}  // namespace mpsshim::server

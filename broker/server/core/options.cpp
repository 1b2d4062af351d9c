#include "broker/server/core/options.hpp"

#include <fmt/format.h>

#include <charconv>
#include <string_view>

#include "broker/server/core/option_table.hpp"
#include "broker/server/scheduling/sm_reserve_option.hpp"

namespace mpsshim::server {
namespace {

// `value` passed check_option_value: a whole number within the option's range.
template <typename T>
T number(std::string_view value) {
  T out{};
  std::from_chars(value.data(), value.data() + value.size(), out);
  return out;
}

LaunchBatchSettings::Graphs graphs_named(std::string_view value) {
  if (value == "runs") return LaunchBatchSettings::Graphs::kRuns;
  if (value == "exact") return LaunchBatchSettings::Graphs::kExact;
  return LaunchBatchSettings::Graphs::kPadded;
}

// Stores a checked value. Every setting of the table has its case (the compiler warns of one
// missing).
void apply(Options& options, Setting setting, const std::string& value) {
  ServerSettings& s = options.settings;
  switch (setting) {
    case Setting::kDevice:
      options.device = number<int>(value);
      return;
    case Setting::kControlFd:
      options.control_fd = number<int>(value);
      return;
    case Setting::kDriver:
      options.driver = value;
      return;
    case Setting::kLogLevel:
      options.log_level = *parse_log_level(value);
      return;
    case Setting::kDefaultSmPercentage:
      s.default_sm_percentage = number<int>(value);
      return;
    case Setting::kDefaultMemoryLimit:
      s.default_memory_limit = number<std::uint64_t>(value);
      return;
    case Setting::kWorkers:
      s.workers = number<std::size_t>(value);
      return;
    case Setting::kContextIdleTimeout:
      s.context_idle_timeout = std::chrono::seconds(number<int>(value));
      return;
    case Setting::kSpinClients:
      s.spin_clients = number<std::size_t>(value);
      return;
    case Setting::kHostFences:
      s.host_fences = value == "on";
      return;
    case Setting::kFenceWatch:
      s.fence_watch = value == "on";
      return;
    case Setting::kCrowdedFenceMaxQueued:
      s.crowded_fence_max_queued = number<std::uint64_t>(value);
      return;
    case Setting::kEventPollUs:
      s.event_poll = std::chrono::microseconds(number<long>(value));
      return;
    case Setting::kShareImages:
      s.share_images = value == "on";
      return;
    case Setting::kImageIdleTimeout:
      s.image_idle_timeout = std::chrono::seconds(number<int>(value));
      return;
    case Setting::kImageVerdictDir:
      s.image_verdict_dir = value;
      return;
    case Setting::kBusyTime:
      s.busy_time = value == "on";
      return;
    case Setting::kPriorityScheduling:
      s.priority.enabled = value == "on";
      return;
    case Setting::kPriorityMaxHoldUs:
      s.priority.max_hold = std::chrono::microseconds(number<long>(value));
      return;
    case Setting::kPriorityFencePollUs:
      s.priority.fence_poll = std::chrono::microseconds(number<long>(value));
      return;
    case Setting::kPriorityRunAhead:
      s.priority.run_ahead = number<std::size_t>(value);
      return;
    case Setting::kPriorityReserveSms:
      s.priority.reserve = *parse_sm_reserve(value);
      return;
    case Setting::kLaunchBatch:
      s.launch_batch.max_launches = number<std::size_t>(value);
      return;
    case Setting::kLaunchBatchMin:
      s.launch_batch.min_launches = number<std::size_t>(value);
      return;
    case Setting::kLaunchBatchGraphs:
      s.launch_batch.graphs = graphs_named(value);
      return;
    case Setting::kLaunchBatchRamp:
      s.launch_batch.ramp_last = number<std::size_t>(value);
      return;
    case Setting::kLaunchBatchKeepNodes:
      s.launch_batch.keep_nodes = value == "on";
      return;
    case Setting::kLaunchBatchPrepare:
      s.launch_batch.prepare_graphs = value == "on";
      return;
    case Setting::kMemoryPreemption:
      s.memory_policy.preemption = value == "on";
      return;
    case Setting::kPreemptionIdleMs:
      s.memory_policy.idle_after = std::chrono::milliseconds(number<long>(value));
      return;
    case Setting::kMemoryOvercommit:
      s.memory_policy.overcommit_percent = number<unsigned>(value);
      return;
    case Setting::kParkPool:
      s.park_pool = number<std::uint64_t>(value);
      return;
    case Setting::kClientLimit:
      parse_client_limit(value, s.client_limits);
      return;
  }
}

static_assert(static_cast<unsigned>(Setting::kClientLimit) < 64, "parse_options keeps a bit each");

}  // namespace

tl::expected<Options, std::string> parse_options(std::span<const char* const> args) {
  Options options;
  if (args.size() == 1 && std::string_view(args[0]) == "--help") {
    options.help = true;
    return options;
  }
  std::uint64_t given = 0;  // bit per Setting
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view flag = args[i];
    const ServerOption* option =
        flag.starts_with("--") ? find_server_option(flag.substr(2)) : nullptr;
    if (option == nullptr) return tl::unexpected(fmt::format("unknown argument {}", flag));
    if (i + 1 >= args.size()) return tl::unexpected(fmt::format("{} needs a value", flag));
    auto value = check_option_value(*option, args[++i], flag);
    if (!value) return tl::unexpected(value.error());
    apply(options, option->setting, *value);
    given |= 1ull << static_cast<unsigned>(option->setting);
  }
  for (const ServerOption& option : server_options()) {
    if (option.required && (given & 1ull << static_cast<unsigned>(option.setting)) == 0) {
      return tl::unexpected(fmt::format("--{} is required", option.flag));
    }
  }
  return options;
}

std::string server_usage() {
  return "usage: mpsshim-server --device N --control-fd FD [--flag VALUE]...\n\n" +
         option_help_lines(server_options(), false);
}

}  // namespace mpsshim::server

#include "broker/server/core/options.hpp"

#include <fmt/format.h>

#include <charconv>
#include <string_view>

namespace mpsshim::server {
namespace {

template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc{} && at == end && !text.empty();
}

}  // namespace

tl::expected<Options, std::string> parse_options(std::span<const char* const> args) {
  Options options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    if (i + 1 >= args.size()) return tl::unexpected(fmt::format("{} needs a value", flag));
    std::string_view value = args[++i];
    if (flag == "--device") {
      if (!parse_number(value, options.device) || options.device < 0) {
        return tl::unexpected(fmt::format("--device {}: not a device ordinal", value));
      }
    } else if (flag == "--control-fd") {
      if (!parse_number(value, options.control_fd) || options.control_fd < 0) {
        return tl::unexpected(fmt::format("--control-fd {}: not a file descriptor", value));
      }
    } else if (flag == "--driver") {
      options.driver = std::string(value);
    } else if (flag == "--log-level") {
      auto level = parse_log_level(value);
      if (!level) {
        return tl::unexpected(
            fmt::format("--log-level {}: expected error, warn, info or debug", value));
      }
      options.log_level = *level;
    } else if (flag == "--default-sm-percentage") {
      int p = 0;
      if (!parse_number(value, p) || p < 1 || p > 100) {
        return tl::unexpected(fmt::format("--default-sm-percentage {}: expected 1 to 100", value));
      }
      options.default_sm_percentage = p;
    } else if (flag == "--default-memory-limit") {
      if (!parse_number(value, options.default_memory_limit)) {
        return tl::unexpected(
            fmt::format("--default-memory-limit {}: expected a number of bytes", value));
      }
    } else if (flag == "--launch-batch") {
      if (!parse_number(value, options.launch_batch) || options.launch_batch > kMaxLaunchBatch) {
        return tl::unexpected(fmt::format(
            "--launch-batch {}: expected 0 or 1 (off) or the most launches per batch, up to {}",
            value, kMaxLaunchBatch));
      }
    } else if (flag == "--launch-batch-min") {
      if (!parse_number(value, options.launch_batch_min) || options.launch_batch_min < 2 ||
          options.launch_batch_min > kMaxLaunchBatch) {
        return tl::unexpected(fmt::format("--launch-batch-min {}: expected 2 to {} launches", value,
                                          kMaxLaunchBatch));
      }
    } else if (flag == "--launch-batch-ramp") {
      if (value == "off") {
        options.launch_batch_ramp = 0;
      } else if (value == "on") {
        options.launch_batch_ramp = LaunchBatchSettings{}.ramp_last;
      } else if (!parse_number(value, options.launch_batch_ramp) ||
                 options.launch_batch_ramp > kMaxLaunchBatch) {
        return tl::unexpected(fmt::format(
            "--launch-batch-ramp {}: expected on, off (0) or the ramp's largest batch, up to {}",
            value, kMaxLaunchBatch));
      }
    } else if (flag == "--launch-batch-graphs") {
      if (value == "padded") {
        options.launch_batch_graphs = LaunchBatchSettings::Graphs::kPadded;
      } else if (value == "runs") {
        options.launch_batch_graphs = LaunchBatchSettings::Graphs::kRuns;
      } else if (value == "exact") {
        options.launch_batch_graphs = LaunchBatchSettings::Graphs::kExact;
      } else {
        return tl::unexpected(
            fmt::format("--launch-batch-graphs {}: expected padded, runs or exact", value));
      }
    } else if (flag == "--busy-time") {
      if (value != "on" && value != "off") {
        return tl::unexpected(fmt::format("--busy-time {}: expected on or off", value));
      }
      options.busy_time = value == "on";
    } else if (flag == "--host-fences") {
      if (value != "on" && value != "off") {
        return tl::unexpected(fmt::format("--host-fences {}: expected on or off", value));
      }
      options.host_fences = value == "on";
    } else if (flag == "--crowded-fence-max-queued") {
      if (!parse_number(value, options.crowded_fence_max_queued) ||
          options.crowded_fence_max_queued > kMaxCrowdedFenceQueued) {
        return tl::unexpected(
            fmt::format("--crowded-fence-max-queued {}: expected 0 to {} operations", value,
                        kMaxCrowdedFenceQueued));
      }
    } else if (flag == "--share-images") {
      if (value != "on" && value != "off") {
        return tl::unexpected(fmt::format("--share-images {}: expected on or off", value));
      }
      options.share_images = value == "on";
    } else if (flag == "--image-idle-timeout") {
      int s = 0;
      if (!parse_number(value, s) || s < 0 || s > 86400) {
        return tl::unexpected(fmt::format(
            "--image-idle-timeout {}: expected seconds from 0 (unload with the last client) to "
            "86400",
            value));
      }
      options.image_idle_timeout_s = s;
    } else if (flag == "--priority-scheduling") {
      if (value != "on" && value != "off") {
        return tl::unexpected(fmt::format("--priority-scheduling {}: expected on or off", value));
      }
      options.priority_scheduling = value == "on";
    } else if (flag == "--priority-max-hold-us") {
      if (!parse_number(value, options.priority_max_hold_us) || options.priority_max_hold_us < 1 ||
          options.priority_max_hold_us > 10'000'000) {
        return tl::unexpected(
            fmt::format("--priority-max-hold-us {}: expected 1 to 10000000 microseconds", value));
      }
    } else if (flag == "--spin-clients") {
      if (!parse_number(value, options.spin_clients) || options.spin_clients < 0 ||
          options.spin_clients > 1'000'000) {
        return tl::unexpected(fmt::format("--spin-clients {}: expected 0 to 1000000", value));
      }
    } else if (flag == "--event-poll-us") {
      if (!parse_number(value, options.event_poll_us) || options.event_poll_us < 0 ||
          options.event_poll_us > 1'000'000) {
        return tl::unexpected(
            fmt::format("--event-poll-us {}: expected 0 to 1000000 microseconds", value));
      }
    } else if (flag == "--priority-fence-poll-us") {
      if (!parse_number(value, options.priority_fence_poll_us) ||
          options.priority_fence_poll_us < 0 || options.priority_fence_poll_us > 1'000'000) {
        return tl::unexpected(
            fmt::format("--priority-fence-poll-us {}: expected 0 to 1000000 microseconds", value));
      }
    } else if (flag == "--priority-run-ahead") {
      if (!parse_number(value, options.priority_run_ahead) || options.priority_run_ahead < 1 ||
          options.priority_run_ahead > 4096) {
        return tl::unexpected(
            fmt::format("--priority-run-ahead {}: expected 1 to 4096 records", value));
      }
    } else if (flag == "--priority-reserve-sms") {
      auto spec = parse_sm_reserve(value);
      if (!spec) return tl::unexpected(spec.error());
      options.priority_reserve_sms = *spec;
    } else if (flag == "--workers") {
      if (!parse_number(value, options.workers) || options.workers > kMaxWorkers) {
        return tl::unexpected(fmt::format("--workers {}: expected 0 (one per available CPU) to {}",
                                          value, kMaxWorkers));
      }
    } else if (flag == "--context-idle-timeout") {
      int s = 0;
      if (!parse_number(value, s) || s < -1 || s > 86400) {
        return tl::unexpected(fmt::format(
            "--context-idle-timeout {}: expected seconds from 0 to 86400, or -1 (never)", value));
      }
      options.context_idle_timeout_s = s;
    } else if (flag == "--client-limit") {
      if (auto error = parse_client_limit(value, options.client_limits)) {
        return tl::unexpected(*error);
      }
    } else {
      return tl::unexpected(fmt::format("unknown argument {}", flag));
    }
  }
  if (options.device < 0) return tl::unexpected(std::string("--device is required"));
  if (options.control_fd < 0) return tl::unexpected(std::string("--control-fd is required"));
  return options;
}

}  // namespace mpsshim::server

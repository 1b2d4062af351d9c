#include "broker/server/core/option_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <stdexcept>

#include "broker/server/accounting/client_limits.hpp"
#include "broker/server/scheduling/sm_reserve_option.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

using enum ValueKind;
using enum Setting;

constexpr std::int64_t kMicrosecondsCap = 1'000'000;
constexpr std::int64_t kSecondsCap = 86'400;

// The order of the usage texts and of docs/daemon.md's table of server flags.
constexpr std::array kOptions{
    ServerOption{.setting = kDevice,
                 .flag = "device",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = 4095,
                 .help = "the GPU's ordinal",
                 .passed_by = PassedBy::kDaemon,
                 .required = true},
    ServerOption{.setting = kControlFd,
                 .flag = "control-fd",
                 .value_name = "FD",
                 .kind = kNumber,
                 .max = 1 << 20,
                 .help = "the daemon's end of the control socket",
                 .passed_by = PassedBy::kDaemon,
                 .required = true},
    ServerOption{.setting = kDriver,
                 .flag = "driver",
                 .value_name = "PATH",
                 .kind = kText,
                 .default_value = "libcuda.so.1",
                 .help = "the CUDA driver library to load",
                 .passed_by = PassedBy::kDaemon},
    ServerOption{.setting = kLogLevel,
                 .flag = "log-level",
                 .value_name = "LEVEL",
                 .kind = kLevel,
                 .default_value = "info",
                 .help = "error, warn, info, debug or trace",
                 .passed_by = PassedBy::kDaemon},
    ServerOption{.setting = kDefaultSmPercentage,
                 .flag = "default-sm-percentage",
                 .value_name = "P",
                 .kind = kNumber,
                 .min = 1,
                 .max = 100,
                 .default_value = "100",
                 .help = "the SM share of clients that ask none",
                 .passed_by = PassedBy::kDaemon},
    ServerOption{.setting = kDefaultMemoryLimit,
                 .flag = "default-memory-limit",
                 .value_name = "BYTES",
                 .kind = kBytes,
                 .default_value = "0",
                 .default_text = "0: none",
                 .help = "the device memory limit of clients that ask none",
                 .passed_by = PassedBy::kDaemon},
    ServerOption{.setting = kWorkers,
                 .flag = "workers",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = 256,
                 .default_value = "0",
                 .default_text = "0: one per CPU the server may run on",
                 .help = "worker threads; each client is served by one for its life",
                 .daemon_flag = "server-workers"},
    ServerOption{.setting = kContextIdleTimeout,
                 .flag = "context-idle-timeout",
                 .value_name = "SECS",
                 .kind = kNumber,
                 .min = -1,
                 .max = kSecondsCap,
                 .default_value = "60",
                 .help =
                     "release the primary context (~500 MiB of GPU memory) after SECS without a "
                     "client, the server's start counting as a client's leaving; 0: as the last "
                     "client leaves; -1: never"},
    ServerOption{.setting = kSpinClients,
                 .flag = "spin-clients",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = kMicrosecondsCap,
                 .default_text = "half the CPUs the server may run on",
                 .help =
                     "with more than N clients the server is crowded: their waiting threads sleep "
                     "after a short spin; 0: always"},
    ServerOption{.setting = kHostFences,
                 .flag = "host-fences",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "on",
                 .help =
                     "learn that a synchronize's work is done from a word the GPU writes into host "
                     "memory instead of polling an event"},
    ServerOption{.setting = kFenceWatch,
                 .flag = "fence-watch",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "on",
                 .help =
                     "a spinning client watches its synchronize's host fence, returns when it "
                     "lands and wakes the worker, which sleeps meanwhile; off: the worker polls "
                     "and answers"},
    ServerOption{.setting = kCrowdedFenceMaxQueued,
                 .flag = "crowded-fence-max-queued",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = 1 << 20,
                 .default_value = "8",
                 .help =
                     "while crowded, a synchronize gets a host fence only behind at most N queued "
                     "operations"},
    ServerOption{
        .setting = kEventPollUs,
        .flag = "event-poll-us",
        .value_name = "N",
        .kind = kNumber,
        .max = kMicrosecondsCap,
        .default_value = "0",
        .default_text = "0: on every pass of the client's worker",
        .help = "how often to ask the driver whether a synchronize's work is done where no host "
                "fence tells, in microseconds"},
    ServerOption{.setting = kShareImages,
                 .flag = "share-images",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "on",
                 .help =
                     "load a library image once for every client that sends the same bytes (images "
                     "without __device__, __constant__ or __managed__ variables)"},
    ServerOption{.setting = kImageIdleTimeout,
                 .flag = "image-idle-timeout",
                 .value_name = "SECS",
                 .kind = kNumber,
                 .max = kSecondsCap,
                 .default_value = "60",
                 .help = "a shared image no client holds stays loaded SECS for the next client; 0: "
                         "unloaded with its last"},
    ServerOption{.setting = kImageVerdictDir,
                 .flag = "image-verdict-dir",
                 .value_name = "DIR",
                 .kind = kText,
                 .default_text = "none",
                 .help = "keep the scan's verdicts on library images in DIR across restarts, so "
                         "that the first client after a start does not wait for the scan"},
    ServerOption{.setting = kBusyTime,
                 .flag = "busy-time",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "off",
                 .help =
                     "measure each client's GPU busy time with timing events (they cost the launch "
                     "path)"},
    ServerOption{.setting = kPriorityScheduling,
                 .flag = "priority-scheduling",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "on",
                 .help =
                     "hold back clients with CUDA_MPS_CLIENT_PRIORITY=1 while a normal client has "
                     "GPU work in flight"},
    ServerOption{.setting = kPriorityMaxHoldUs,
                 .flag = "priority-max-hold-us",
                 .value_name = "N",
                 .kind = kNumber,
                 .min = 1,
                 .max = 10'000'000,
                 .default_value = "2000",
                 .help = "the longest a below-normal client is held back at once, in µs"},
    ServerOption{.setting = kPriorityFencePollUs,
                 .flag = "priority-fence-poll-us",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = kMicrosecondsCap,
                 .default_value = "50",
                 .help =
                     "with --host-fences off or while crowded: how often to ask whether priority "
                     "fences completed, in µs; 0: every pass"},
    ServerOption{.setting = kPriorityRunAhead,
                 .flag = "priority-run-ahead",
                 .value_name = "N",
                 .kind = kNumber,
                 .min = 1,
                 .max = 4096,
                 .default_value = "4",
                 .help = "records a held-back client may drain per pass"},
    ServerOption{.setting = kPriorityReserveSms,
                 .flag = "priority-reserve-sms",
                 .value_name = "N|P%",
                 .kind = kSmReserve,
                 .max = 4096,
                 .default_value = "18%",
                 .help = "SMs (or a share of them) kept for normal-priority clients while one is "
                         "connected; 0 or off: none"},
    ServerOption{.setting = kLaunchBatch,
                 .flag = "launch-batch",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = 256,
                 .default_value = "64",
                 .help = "the most launches of one client issued as one graph launch; 0 or 1: off",
                 .daemon_flag = "server-launch-batch"},
    ServerOption{.setting = kLaunchBatchMin,
                 .flag = "launch-batch-min",
                 .value_name = "N",
                 .kind = kNumber,
                 .min = 2,
                 .max = 256,
                 .default_value = "8",
                 .help = "the fewest waiting launches that go out as one graph launch",
                 .daemon_flag = "server-launch-batch-min"},
    ServerOption{.setting = kLaunchBatchGraphs,
                 .flag = "launch-batch-graphs",
                 .value_name = "padded|runs|exact",
                 .kind = kChoice,
                 .words = "padded|runs|exact",
                 .default_value = "padded",
                 .help =
                     "padded: one graph of the next power-of-two length; runs: power-of-two runs; "
                     "exact: one graph of the batch's length"},
    ServerOption{
        .setting = kLaunchBatchRamp,
        .flag = "launch-batch-ramp",
        .value_name = "N|on|off",
        .kind = kNumber,
        .max = 256,
        .words = "on=8|off=0",
        .default_value = "8",
        .default_text = "`on`: 8",
        .help = "after a client synchronized a stream, its batches grow from the minimum up to "
                "N launches; off: no ramp"},
    ServerOption{.setting = kLaunchBatchKeepNodes,
                 .flag = "launch-batch-keep-nodes",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "on",
                 .help = "a graph node that holds a launch's function, shape and arguments "
                         "already is not updated; off: every node at every batch"},
    ServerOption{.setting = kLaunchBatchPrepare,
                 .flag = "launch-batch-prepare",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "on",
                 .help = "build the graphs of the shortest and the longest padded batch at a "
                         "client's first launch; off: at their second sighting"},
    ServerOption{.setting = kMemoryPreemption,
                 .flag = "memory-preemption",
                 .value_name = "on|off",
                 .kind = kSwitch,
                 .default_value = "off",
                 .help = "a normal-priority client's cuMemAlloc, cuMemAllocPitch or cuMemCreate "
                         "that does not fit suspends idle below-normal clients, least recently "
                         "active first; they resume when the memory frees"},
    ServerOption{.setting = kPreemptionIdleMs,
                 .flag = "preemption-idle-ms",
                 .value_name = "N",
                 .kind = kNumber,
                 .max = 86'400'000,
                 .default_value = "1000",
                 .help = "a below-normal client is idle, and may be suspended for memory, after N "
                         "ms without a call and with none waiting for its GPU work"},
    ServerOption{.setting = kMemoryOvercommit,
                 .flag = "memory-overcommit",
                 .value_name = "PERCENT|off",
                 .kind = kNumber,
                 .max = 10'000,
                 .words = "off=0",
                 .default_value = "0",
                 .default_text = "`off`",
                 .help = "admit clients while their memory limits add up to PERCENT of the GPU's "
                         "memory at most (no limit counts as the whole GPU); a cuMemAlloc, "
                         "cuMemAllocPitch or cuMemCreate that does not fit waits suspended "
                         "instead of failing; 0 or off: neither"},
    ServerOption{.setting = kParkPool,
                 .flag = "park-pool",
                 .value_name = "BYTES",
                 .kind = kBytes,
                 .default_value = "0",
                 .default_text = "0: none",
                 .help = "page-locked host memory kept ready for suspends while the GPU's context "
                         "is held, so that parking up to BYTES is a plain copy; 0: none"},
    ServerOption{.setting = kClientLimit,
                 .flag = "client-limit",
                 .value_name = "NAME=VALUE",
                 .kind = kNamedLimit,
                 .default_text = "repeatable",
                 .help = "a per-client cap (streams, events, modules, graphs, memory-pools, "
                         "allocations, pinned, host-functions, in-flight, ipc-opens); 0: none",
                 .repeatable = true},
};

template <typename T>
bool whole_number(std::string_view text, T& out) {
  auto [at, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc{} && at == text.data() + text.size() && !text.empty();
}

// The NUMBER of WORD in "on=8|off=0"; empty when `text` is not one of the words.
std::string_view word_value(std::string_view words, std::string_view text) {
  while (!words.empty()) {
    const std::size_t bar = words.find('|');
    const std::string_view entry = words.substr(0, bar);
    const std::size_t equals = entry.find('=');
    if (entry.substr(0, equals) == text) {
      return equals == std::string_view::npos ? entry : entry.substr(equals + 1);
    }
    words = bar == std::string_view::npos ? std::string_view{} : words.substr(bar + 1);
  }
  return {};
}

std::string expected_text(const ServerOption& option) {
  switch (option.kind) {
    case kNumber: {
      std::string range = fmt::format("a whole number from {} to {}", option.min, option.max);
      if (!option.words.empty()) {
        std::string words(option.words);
        std::replace(words.begin(), words.end(), '|', ' ');
        range += fmt::format(", or one of {}", words);
      }
      return range;
    }
    case kBytes:
      return "a whole number of bytes";
    case kSwitch:
      return "on or off";
    case kChoice: {
      std::string words(option.words);
      std::replace(words.begin(), words.end(), '|', ',');
      return "one of " + words;
    }
    case kText:
      return "a value";
    case kLevel:
      return "error, warn, info, debug or trace";
    case kSmReserve:
    case kNamedLimit:
      break;
  }
  return {};
}

}  // namespace

std::span<const ServerOption> server_options() {
  return kOptions;
}

const ServerOption& server_option(Setting setting) {
  for (const ServerOption& option : kOptions) {
    if (option.setting == setting) return option;
  }
  throw std::logic_error("a setting missing from the option table");
}

const ServerOption* find_server_option(std::string_view flag) {
  for (const ServerOption& option : kOptions) {
    if (option.flag == flag) return &option;
  }
  return nullptr;
}

std::string_view daemon_flag_of(const ServerOption& option) {
  if (option.passed_by != PassedBy::kDaemonOption) return {};
  return option.daemon_flag.empty() ? option.flag : option.daemon_flag;
}

std::string_view default_text_of(const ServerOption& option) {
  return option.default_text.empty() ? option.default_value : option.default_text;
}

tl::expected<std::string, std::string> check_option_value(const ServerOption& option,
                                                          std::string_view value,
                                                          std::string_view as) {
  switch (option.kind) {
    case kNumber: {
      std::string_view number = word_value(option.words, value);
      if (number.empty()) number = value;
      std::int64_t n = 0;
      if (whole_number(number, n) && n >= option.min && n <= option.max) return std::string(number);
      break;
    }
    case kBytes: {
      std::uint64_t bytes = 0;
      if (whole_number(value, bytes)) return std::string(value);
      break;
    }
    case kSwitch:
      if (value == "on" || value == "off") return std::string(value);
      break;
    case kChoice:
      if (!value.empty() && value.find('|') == std::string_view::npos &&
          !word_value(option.words, value).empty()) {
        return std::string(value);
      }
      break;
    case kText:
      if (!value.empty()) return std::string(value);
      break;
    case kLevel:
      if (auto level = parse_log_level(value)) return std::string(log_level_name(*level));
      break;
    case kSmReserve: {
      auto spec = parse_sm_reserve(value);
      if (!spec) return tl::unexpected(spec.error());  // it names the flag
      return format_sm_reserve(*spec);
    }
    case kNamedLimit: {
      ClientLimits scratch;
      if (auto error = parse_client_limit(value, scratch)) return tl::unexpected(*error);
      return std::string(value);
    }
  }
  return tl::unexpected(fmt::format("{} {}: expected {}", as, value, expected_text(option)));
}

std::string documented_values(const ServerOption& option) {
  const std::string_view fallback = option.required ? "required" : default_text_of(option);
  switch (option.kind) {
    case kNumber:
      return fmt::format("{}–{} ({})", option.min, option.max, fallback);
    case kSmReserve:
      return fmt::format("0–{} SMs or 0%–90% (`{}`)", option.max, fallback);
    case kNamedLimit:
      return std::string(fallback);
    case kBytes:
      return fmt::format("bytes ({})", fallback);
    case kText:
      if (option.default_value.empty()) return fmt::format("a path ({})", fallback);
      break;
    case kSwitch:
    case kChoice:
    case kLevel:
      break;
  }
  return fmt::format("`{}`", fallback);
}

std::string option_help_lines(std::span<const ServerOption> options, bool daemon_names) {
  constexpr std::size_t kHelpColumn = 23;
  constexpr std::size_t kWidth = 96;
  std::string out;
  for (const ServerOption& option : options) {
    const std::string_view name = daemon_names ? daemon_flag_of(option) : option.flag;
    std::string line = fmt::format("  --{} {}", name, option.value_name);
    std::string text(option.help);
    std::string fallback(default_text_of(option));
    std::erase(fallback, '`');
    if (option.required) {
      text += " (required)";
    } else if (!fallback.empty() && option.kind != kNamedLimit) {
      text += fmt::format(" (default {})", fallback);
    } else if (option.repeatable) {
      text += " (repeatable)";
    }
    // The first words beside the flag when they fit, else on the next line.
    line += line.size() + 2 <= kHelpColumn ? std::string(kHelpColumn - line.size(), ' ') : "  ";
    std::size_t column = line.size();
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t end = text.find(' ', at);
      if (end == std::string::npos) end = text.size();
      const std::string_view word(text.data() + at, end - at);
      if (column + word.size() > kWidth && column > kHelpColumn) {
        line += '\n' + std::string(kHelpColumn, ' ');
        column = kHelpColumn;
      } else if (column != kHelpColumn && line.back() != ' ') {
        line += ' ';
        ++column;
      }
      line += word;
      column += word.size();
      at = end + 1;
    }
    out += line + '\n';
  }
  return out;
}

void PassedSettings::set(Setting setting, std::string value) {
  if (!server_option(setting).repeatable) erase(setting);
  values_.emplace_back(setting, std::move(value));
}

void PassedSettings::erase(Setting setting) {
  std::erase_if(values_, [setting](const auto& entry) { return entry.first == setting; });
}

const std::string* PassedSettings::find(Setting setting) const {
  for (auto it = values_.rbegin(); it != values_.rend(); ++it) {
    if (it->first == setting) return &it->second;
  }
  return nullptr;
}

std::vector<std::string> PassedSettings::arguments() const {
  std::vector<std::string> args;
  for (const auto& [setting, value] : values_) {
    args.push_back(fmt::format("--{}", server_option(setting).flag));
    args.push_back(value);
  }
  return args;
}

}  // namespace mpsshim::server

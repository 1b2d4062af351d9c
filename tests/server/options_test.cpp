#include "broker/server/core/options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "broker/server/core/option_table.hpp"
#include "broker/server/scheduling/sm_reserve_option.hpp"

namespace mpsshim::server {
namespace {

tl::expected<Options, std::string> parse(std::vector<const char*> args) {
  return parse_options(std::span<const char* const>(args.data(), args.size()));
}

TEST_CASE("the daemon's command line parses", "[server][options]") {
  auto sut =
      parse({"--device", "1", "--control-fd", "5", "--driver", "/x/libcuda.so.1", "--log-level",
             "debug", "--default-sm-percentage", "25", "--default-memory-limit", "1073741824"});
  REQUIRE(sut);
  CHECK(sut->device == 1);
  CHECK(sut->control_fd == 5);
  CHECK(sut->driver == "/x/libcuda.so.1");
  CHECK(sut->log_level == LogLevel::kDebug);
  CHECK(sut->settings.default_sm_percentage == 25);
  CHECK(sut->settings.default_memory_limit == 1073741824u);
}

TEST_CASE("defaults and bad arguments", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->driver == "libcuda.so.1");
  CHECK(sut->settings.default_sm_percentage == 100);
  CHECK_FALSE(parse({"--device", "0"}));
  CHECK_FALSE(parse({"--device", "x", "--control-fd", "3"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--default-sm-percentage", "0"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--bogus", "1"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd"}));
}

TEST_CASE(
    "--launch-batch sets the most launches per graph launch (64 by default); 0 and 1 turn it off",
    "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->settings.launch_batch.max_launches ==
        64);  // on by default: measured faster (launch_batch.hpp)
  CHECK(LaunchBatchSettings{}.enabled());
  for (const char* n : {"0", "1"}) {
    auto off = parse({"--device", "0", "--control-fd", "3", "--launch-batch", n});
    REQUIRE(off);
    LaunchBatchSettings settings;
    settings.max_launches = off->settings.launch_batch.max_launches;
    CHECK_FALSE(settings.enabled());
  }
  auto eight = parse({"--device", "0", "--control-fd", "3", "--launch-batch", "8"});
  REQUIRE(eight);
  CHECK(eight->settings.launch_batch.max_launches == 8);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--launch-batch", "257"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--launch-batch", "-1"}));
  CHECK(server_usage().find("--launch-batch N") != std::string::npos);
}

TEST_CASE("--launch-batch-min sets the shortest run that goes out as a graph launch",
          "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->settings.launch_batch.min_launches == LaunchBatchSettings{}.min_launches);
  auto four = parse({"--device", "0", "--control-fd", "3", "--launch-batch-min", "4"});
  REQUIRE(four);
  CHECK(four->settings.launch_batch.min_launches == 4);
  for (const char* bad : {"1", "0", "257", "x"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--launch-batch-min", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--launch-batch-min") != std::string::npos);
  }
  CHECK(server_usage().find("--launch-batch-min N") != std::string::npos);
}

TEST_CASE("--client-limit sets one cap and keeps the other defaults", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3", "--client-limit", "streams=8",
                    "--client-limit", "in-flight=0"});
  REQUIRE(sut);
  CHECK(sut->settings.client_limits[ClientLimit::kStreams] == 8);
  CHECK(sut->settings.client_limits[ClientLimit::kInFlight] == 0);  // no cap
  CHECK(sut->settings.client_limits[ClientLimit::kEvents] == 65536);
  CHECK(sut->settings.client_limits[ClientLimit::kPinnedBytes] > 0);  // half of the host's memory
  auto bad = parse({"--device", "0", "--control-fd", "3", "--client-limit", "streams=-1"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--client-limit streams=-1") != std::string::npos);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--client-limit", "nonsense=1"}));
}

}  // namespace
TEST_CASE("--launch-batch-ramp is on by default; off and bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->settings.launch_batch.ramp_last == 8);
  CHECK(LaunchBatchSettings{}.ramp_last == 8);
  auto off = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "off"});
  REQUIRE(off);
  CHECK(off->settings.launch_batch.ramp_last == 0);
  auto longer = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "32"});
  REQUIRE(longer);
  CHECK(longer->settings.launch_batch.ramp_last == 32);
  auto on = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "32",
                   "--launch-batch-ramp", "on"});
  REQUIRE(on);
  CHECK(on->settings.launch_batch.ramp_last == 8);
  for (const char* bad : {"yes", "257", "-1"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--launch-batch-ramp") != std::string::npos);
  }
  CHECK(server_usage().find("--launch-batch-ramp N|on|off") != std::string::npos);
}

TEST_CASE("--launch-batch-graphs is padded by default; runs, exact and bad values",
          "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->settings.launch_batch.graphs == LaunchBatchSettings::Graphs::kPadded);
  CHECK(LaunchBatchSettings{}.graphs == LaunchBatchSettings::Graphs::kPadded);
  auto runs = parse({"--device", "0", "--control-fd", "3", "--launch-batch-graphs", "runs"});
  REQUIRE(runs);
  CHECK(runs->settings.launch_batch.graphs == LaunchBatchSettings::Graphs::kRuns);
  auto exact = parse({"--device", "0", "--control-fd", "3", "--launch-batch-graphs", "exact"});
  REQUIRE(exact);
  CHECK(exact->settings.launch_batch.graphs == LaunchBatchSettings::Graphs::kExact);
  auto bad = parse({"--device", "0", "--control-fd", "3", "--launch-batch-graphs", "pow2"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--launch-batch-graphs pow2") != std::string::npos);
  CHECK(server_usage().find("--launch-batch-graphs padded|runs|exact") != std::string::npos);
}

TEST_CASE("--crowded-fence-max-queued: 8 by default, any count, bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->settings.crowded_fence_max_queued == kCrowdedFenceMaxQueued);
  auto zero = parse({"--device", "0", "--control-fd", "3", "--crowded-fence-max-queued", "0"});
  REQUIRE(zero);
  CHECK(zero->settings.crowded_fence_max_queued == 0);
  auto many = parse({"--device", "0", "--control-fd", "3", "--crowded-fence-max-queued", "64"});
  REQUIRE(many);
  CHECK(many->settings.crowded_fence_max_queued == 64);
  for (const char* bad : {"-1", "many", "2000000"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--crowded-fence-max-queued", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--crowded-fence-max-queued") != std::string::npos);
  }
  CHECK(server_usage().find("--crowded-fence-max-queued N") != std::string::npos);
}

TEST_CASE("--image-idle-timeout: 60 s by default, 0 to a day, bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->settings.image_idle_timeout.count() == 60);
  auto zero = parse({"--device", "0", "--control-fd", "3", "--image-idle-timeout", "0"});
  REQUIRE(zero);
  CHECK(zero->settings.image_idle_timeout.count() == 0);
  auto day = parse({"--device", "0", "--control-fd", "3", "--image-idle-timeout", "86400"});
  REQUIRE(day);
  CHECK(day->settings.image_idle_timeout.count() == 86400);
  for (const char* bad : {"-1", "soon", "86401"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--image-idle-timeout", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--image-idle-timeout") != std::string::npos);
  }
  CHECK(server_usage().find("--image-idle-timeout SECS") != std::string::npos);
}

TEST_CASE("--host-fences is on by default; off and bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->settings.host_fences);
  auto off = parse({"--device", "0", "--control-fd", "3", "--host-fences", "off"});
  REQUIRE(off);
  CHECK_FALSE(off->settings.host_fences);
  auto bad = parse({"--device", "0", "--control-fd", "3", "--host-fences", "yes"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == "--host-fences yes: expected on or off");
  CHECK(server_usage().find("--host-fences on|off") != std::string::npos);
}

TEST_CASE("--spin-clients: unset (half the CPUs) by default, 0 to 1000000", "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK_FALSE(defaults->settings.spin_clients);  // half the CPUs, worked out by the server
  auto set = parse({"--device", "0", "--control-fd", "3", "--spin-clients", "0"});
  REQUIRE(set);
  CHECK(set->settings.spin_clients == 0u);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--spin-clients", "-1"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--spin-clients", "many"}));
}

TEST_CASE("--event-poll-us: 0 by default, 0 to 1000000", "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->settings.event_poll.count() == kDefaultEventPoll.count());
  auto set = parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "25"});
  REQUIRE(set);
  CHECK(set->settings.event_poll.count() == 25);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "-1"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "1000001"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "5us"}));
}

TEST_CASE("--priority-scheduling and its bounds (on, 2000 us, 4 records, 50 us by default)",
          "[server][options][priority]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->settings.priority.enabled);
  CHECK(defaults->settings.priority.max_hold.count() == 2000);
  CHECK(defaults->settings.priority.run_ahead == 4);
  CHECK(defaults->settings.priority.fence_poll.count() == 50);
  auto set = parse({"--device", "0", "--control-fd", "3", "--priority-scheduling", "off",
                    "--priority-max-hold-us", "500", "--priority-run-ahead", "16",
                    "--priority-fence-poll-us", "0"});
  REQUIRE(set);
  CHECK_FALSE(set->settings.priority.enabled);
  CHECK(set->settings.priority.max_hold.count() == 500);
  CHECK(set->settings.priority.run_ahead == 16);
  CHECK(set->settings.priority.fence_poll.count() == 0);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-fence-poll-us", "-5"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-scheduling", "maybe"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-max-hold-us", "0"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-run-ahead", "0"}));
  CHECK(server_usage().find("--priority-scheduling on|off") != std::string::npos);
}

TEST_CASE("--priority-reserve-sms takes SMs, a percentage or off (18% by default)",
          "[server][options][priority][reserve]") {
  auto with = [](const char* value) {
    return parse({"--device", "0", "--control-fd", "3", "--priority-reserve-sms", value});
  };
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->settings.priority.reserve == SmReserveSpec{18, true});
  CHECK(with("16")->settings.priority.reserve == SmReserveSpec{16, false});
  CHECK(with("25%")->settings.priority.reserve == SmReserveSpec{25, true});
  CHECK(with("0")->settings.priority.reserve.amount == 0);
  CHECK(with("0%")->settings.priority.reserve == SmReserveSpec{});
  CHECK(with("off")->settings.priority.reserve == SmReserveSpec{});
  for (const char* bad : {"-8", "91%", "4097", "lots", "%", "", "16 ", "8SMs", "1.5%"}) {
    INFO(bad);
    auto refused = with(bad);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find(fmt::format("--priority-reserve-sms {}: expected a number of SMs",
                                           bad)) != std::string::npos);
  }
  CHECK(format_sm_reserve(*parse_sm_reserve("25%")) == "25%");
  CHECK(format_sm_reserve(*parse_sm_reserve("off")) == "0");
  CHECK(server_usage().find("--priority-reserve-sms N|P%") != std::string::npos);
}

}  // namespace mpsshim::server

namespace mpsshim::server {
namespace {

// Every field a flag of the table sets, so that two parses can be compared.
std::string describe(const Options& o) {
  const ServerSettings& s = o.settings;
  std::string limits;
  for (std::uint64_t v : s.client_limits.values) limits += fmt::format("{},", v);
  return fmt::format(
      "device={} fd={} driver={} log={} sm={} mem={} workers={} ctx={} spin={} hf={} fw={} cfmq={} "
      "poll={} share={} img={} verdicts={} busy={} prio={} hold={} fpoll={} ahead={} reserve={} "
      "batch={} "
      "min={} graphs={} ramp={} keep={} prepare={} preempt={} idle={} overcommit={} park={} "
      "limits={}",
      o.device, o.control_fd, o.driver, static_cast<int>(o.log_level), s.default_sm_percentage,
      s.default_memory_limit, s.workers, s.context_idle_timeout.count(),
      s.spin_clients ? static_cast<long long>(*s.spin_clients) : -1LL, s.host_fences, s.fence_watch,
      s.crowded_fence_max_queued, s.event_poll.count(), s.share_images,
      s.image_idle_timeout.count(), s.image_verdict_dir, s.busy_time, s.priority.enabled,
      s.priority.max_hold.count(), s.priority.fence_poll.count(), s.priority.run_ahead,
      format_sm_reserve(s.priority.reserve), s.launch_batch.max_launches,
      s.launch_batch.min_launches, static_cast<int>(s.launch_batch.graphs),
      s.launch_batch.ramp_last, s.launch_batch.keep_nodes, s.launch_batch.prepare_graphs,
      s.memory_policy.preemption, s.memory_policy.idle_after.count(),
      s.memory_policy.overcommit_percent, s.park_pool, limits);
}

// A valid value of `option` other than its default.
std::string other_value(const ServerOption& option) {
  switch (option.kind) {
    case ValueKind::kNumber:
      return std::to_string(option.default_value == std::to_string(option.max) ? option.min
                                                                               : option.max);
    case ValueKind::kBytes:
      return "18446744073709551615";  // any 64-bit size, as mpsshimd's sizes
    case ValueKind::kSwitch:
      return option.default_value == "on" ? "off" : "on";
    case ValueKind::kChoice:
      return option.default_value == "padded" ? "exact" : "padded";
    case ValueKind::kText:
      return "/elsewhere/libcuda.so.1";
    case ValueKind::kLevel:
      return "debug";
    case ValueKind::kSmReserve:
      return "8";
    case ValueKind::kNamedLimit:
      return "streams=3";
  }
  return {};
}

TEST_CASE("the option table names every setting once, under names of its own",
          "[server][options][table]") {
  std::set<Setting> settings;
  std::set<std::string_view> flags, daemon_flags;
  for (const ServerOption& option : server_options()) {
    INFO(option.flag);
    CHECK(settings.insert(option.setting).second);
    CHECK(flags.insert(option.flag).second);
    CHECK(find_server_option(option.flag) == &option);
    CHECK(&server_option(option.setting) == &option);
    CHECK_FALSE(option.help.empty());
    if (option.passed_by == PassedBy::kDaemonOption) {
      CHECK(daemon_flags.insert(daemon_flag_of(option)).second);
    }
  }
  CHECK(settings.size() == static_cast<std::size_t>(Setting::kClientLimit) + 1);
  CHECK(find_server_option("nonsense") == nullptr);
}

TEST_CASE("each flag's default is ServerSettings{}'s, which the tests get, and each flag sets it",
          "[server][options][table]") {
  const auto plain = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(plain);
  CHECK(describe(*plain) == describe(Options{0, 3, "libcuda.so.1", LogLevel::kInfo, {}}));
  for (const ServerOption& option : server_options()) {
    if (option.required) continue;
    INFO(option.flag);
    const std::string flag = fmt::format("--{}", option.flag);
    if (!option.default_value.empty()) {
      auto given = parse({"--device", "0", "--control-fd", "3", flag.c_str(),
                          std::string(option.default_value).c_str()});
      REQUIRE(given);
      CHECK(describe(*given) == describe(*plain));
    }
    const std::string other = other_value(option);
    auto changed = parse({"--device", "0", "--control-fd", "3", flag.c_str(), other.c_str()});
    REQUIRE(changed);
    CHECK(describe(*changed) != describe(*plain));
  }
}

TEST_CASE("--help prints every flag; a value out of range names the flag and the range",
          "[server][options][table]") {
  auto help = parse({"--help"});
  REQUIRE(help);
  CHECK(help->help);
  for (const ServerOption& option : server_options()) {
    CHECK(server_usage().find(fmt::format("--{} {}", option.flag, option.value_name)) !=
          std::string::npos);
  }
  auto bad = parse({"--device", "0", "--control-fd", "3", "--workers", "300"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == "--workers 300: expected a whole number from 0 to 256");
  auto word = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "maybe"});
  REQUIRE_FALSE(word);
  CHECK(word.error() ==
        "--launch-batch-ramp maybe: expected a whole number from 0 to 256, or one of on=8 off=0");
}

TEST_CASE("mpsshimd's pass-through keeps the last value, every repeatable one, in order",
          "[server][options][table]") {
  PassedSettings passed;
  passed.set(Setting::kLaunchBatch, "16");
  passed.set(Setting::kClientLimit, "streams=4");
  passed.set(Setting::kLaunchBatch, "0");
  passed.set(Setting::kClientLimit, "events=9");
  CHECK(passed.arguments() == std::vector<std::string>{"--client-limit", "streams=4",
                                                       "--launch-batch", "0", "--client-limit",
                                                       "events=9"});
  REQUIRE(passed.find(Setting::kLaunchBatch) != nullptr);
  CHECK(*passed.find(Setting::kLaunchBatch) == "0");
  passed.erase(Setting::kClientLimit);
  CHECK(passed.arguments() == std::vector<std::string>{"--launch-batch", "0"});
  CHECK(passed.find(Setting::kWorkers) == nullptr);
}

// docs/daemon.md's tables: mpsshimd's options (`| \`--flag VALUE\` | values | ...`) and
// mpsshim-server's flags list every setting with the table's values and default.
TEST_CASE("docs/daemon.md gives every setting the table's values and default",
          "[server][options][table][docs]") {
  const char* root = std::getenv("MPSSHIM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  std::ifstream in(std::string(root) + "/docs/daemon.md");
  REQUIRE(in);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("| `--")) rows.push_back(line);
  }
  auto cell = [](std::string_view flag, std::string_view value_name) {
    std::string name = fmt::format("`--{} {}`", flag, value_name);
    for (std::size_t at = 0; (at = name.find('|', at)) != std::string::npos; at += 2) {
      name.insert(at, "\\");
    }
    return name;
  };
  auto row_with = [&](const std::string& first, const std::string& second) {
    const std::string start = fmt::format("| {} | {} |", first, second);
    return std::count_if(rows.begin(), rows.end(),
                         [&](const std::string& row) { return row.starts_with(start); });
  };
  for (const ServerOption& option : server_options()) {
    INFO(option.flag);
    std::string values = documented_values(option);
    for (std::size_t at = 0; (at = values.find('|', at)) != std::string::npos; at += 2) {
      values.insert(at, "\\");
    }
    // Among the server's flags, and among mpsshimd's options when one passes it on. The daemon
    // sets the others from options of its own, which may share the name and values.
    const std::string as_server = cell(option.flag, option.value_name);
    if (option.passed_by == PassedBy::kDaemonOption) {
      const std::string as_daemon = cell(daemon_flag_of(option), option.value_name);
      CHECK(row_with(as_server, values) +
                (as_daemon != as_server ? row_with(as_daemon, values) : 0) ==
            2);
    } else {
      CHECK(row_with(as_server, values) >= 1);
    }
  }
}

}  // namespace
}  // namespace mpsshim::server

#include "broker/server/core/options.hpp"

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

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
  CHECK(sut->default_sm_percentage == 25);
  CHECK(sut->default_memory_limit == 1073741824u);
}

TEST_CASE("defaults and bad arguments", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->driver == "libcuda.so.1");
  CHECK(sut->default_sm_percentage == 100);
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
  CHECK(defaults->launch_batch == 64);  // on by default: measured faster (launch_batch.hpp)
  CHECK(LaunchBatchSettings{}.enabled());
  for (const char* n : {"0", "1"}) {
    auto off = parse({"--device", "0", "--control-fd", "3", "--launch-batch", n});
    REQUIRE(off);
    LaunchBatchSettings settings;
    settings.max_launches = off->launch_batch;
    CHECK_FALSE(settings.enabled());
  }
  auto eight = parse({"--device", "0", "--control-fd", "3", "--launch-batch", "8"});
  REQUIRE(eight);
  CHECK(eight->launch_batch == 8);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--launch-batch", "257"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--launch-batch", "-1"}));
  CHECK(std::string(kUsage).find("--launch-batch N") != std::string::npos);
}

TEST_CASE("--launch-batch-min sets the shortest run that goes out as a graph launch",
          "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->launch_batch_min == LaunchBatchSettings{}.min_launches);
  auto four = parse({"--device", "0", "--control-fd", "3", "--launch-batch-min", "4"});
  REQUIRE(four);
  CHECK(four->launch_batch_min == 4);
  for (const char* bad : {"1", "0", "257", "x"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--launch-batch-min", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--launch-batch-min") != std::string::npos);
  }
  CHECK(std::string(kUsage).find("--launch-batch-min N") != std::string::npos);
}

TEST_CASE("--client-limit sets one cap and keeps the other defaults", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3", "--client-limit", "streams=8",
                    "--client-limit", "in-flight=0"});
  REQUIRE(sut);
  CHECK(sut->client_limits[ClientLimit::kStreams] == 8);
  CHECK(sut->client_limits[ClientLimit::kInFlight] == 0);  // no cap
  CHECK(sut->client_limits[ClientLimit::kEvents] == 65536);
  CHECK(sut->client_limits[ClientLimit::kPinnedBytes] > 0);  // half of the host's memory
  auto bad = parse({"--device", "0", "--control-fd", "3", "--client-limit", "streams=-1"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--client-limit streams=-1") != std::string::npos);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--client-limit", "nonsense=1"}));
}

}  // namespace
TEST_CASE("--launch-batch-ramp is on by default; off and bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->launch_batch_ramp == 8);
  CHECK(LaunchBatchSettings{}.ramp_last == 8);
  auto off = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "off"});
  REQUIRE(off);
  CHECK(off->launch_batch_ramp == 0);
  auto longer = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "32"});
  REQUIRE(longer);
  CHECK(longer->launch_batch_ramp == 32);
  auto on = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", "32",
                   "--launch-batch-ramp", "on"});
  REQUIRE(on);
  CHECK(on->launch_batch_ramp == 8);
  for (const char* bad : {"yes", "257", "-1"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--launch-batch-ramp", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--launch-batch-ramp") != std::string::npos);
  }
  CHECK(std::string(kUsage).find("--launch-batch-ramp N|on|off") != std::string::npos);
}

TEST_CASE("--launch-batch-graphs is padded by default; runs, exact and bad values",
          "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->launch_batch_graphs == LaunchBatchSettings::Graphs::kPadded);
  CHECK(LaunchBatchSettings{}.graphs == LaunchBatchSettings::Graphs::kPadded);
  auto runs = parse({"--device", "0", "--control-fd", "3", "--launch-batch-graphs", "runs"});
  REQUIRE(runs);
  CHECK(runs->launch_batch_graphs == LaunchBatchSettings::Graphs::kRuns);
  auto exact = parse({"--device", "0", "--control-fd", "3", "--launch-batch-graphs", "exact"});
  REQUIRE(exact);
  CHECK(exact->launch_batch_graphs == LaunchBatchSettings::Graphs::kExact);
  auto bad = parse({"--device", "0", "--control-fd", "3", "--launch-batch-graphs", "pow2"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--launch-batch-graphs pow2") != std::string::npos);
  CHECK(std::string(kUsage).find("--launch-batch-graphs padded|runs|exact") != std::string::npos);
}

TEST_CASE("--crowded-fence-max-queued: 8 by default, any count, bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->crowded_fence_max_queued == kCrowdedFenceMaxQueued);
  auto zero = parse({"--device", "0", "--control-fd", "3", "--crowded-fence-max-queued", "0"});
  REQUIRE(zero);
  CHECK(zero->crowded_fence_max_queued == 0);
  auto many = parse({"--device", "0", "--control-fd", "3", "--crowded-fence-max-queued", "64"});
  REQUIRE(many);
  CHECK(many->crowded_fence_max_queued == 64);
  for (const char* bad : {"-1", "many", "2000000"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--crowded-fence-max-queued", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--crowded-fence-max-queued") != std::string::npos);
  }
  CHECK(std::string(kUsage).find("--crowded-fence-max-queued N") != std::string::npos);
}

TEST_CASE("--image-idle-timeout: 60 s by default, 0 to a day, bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->image_idle_timeout_s == 60);
  auto zero = parse({"--device", "0", "--control-fd", "3", "--image-idle-timeout", "0"});
  REQUIRE(zero);
  CHECK(zero->image_idle_timeout_s == 0);
  auto day = parse({"--device", "0", "--control-fd", "3", "--image-idle-timeout", "86400"});
  REQUIRE(day);
  CHECK(day->image_idle_timeout_s == 86400);
  for (const char* bad : {"-1", "soon", "86401"}) {
    auto refused = parse({"--device", "0", "--control-fd", "3", "--image-idle-timeout", bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("--image-idle-timeout") != std::string::npos);
  }
  CHECK(std::string(kUsage).find("--image-idle-timeout SECS") != std::string::npos);
}

TEST_CASE("--host-fences is on by default; off and bad values", "[server][options]") {
  auto sut = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(sut);
  CHECK(sut->host_fences);
  auto off = parse({"--device", "0", "--control-fd", "3", "--host-fences", "off"});
  REQUIRE(off);
  CHECK_FALSE(off->host_fences);
  auto bad = parse({"--device", "0", "--control-fd", "3", "--host-fences", "yes"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == "--host-fences yes: expected on or off");
  CHECK(std::string(kUsage).find("--host-fences on|off") != std::string::npos);
}

TEST_CASE("--spin-clients: unset (half the CPUs) by default, 0 to 1000000", "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->spin_clients == -1);
  auto set = parse({"--device", "0", "--control-fd", "3", "--spin-clients", "0"});
  REQUIRE(set);
  CHECK(set->spin_clients == 0);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--spin-clients", "-1"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--spin-clients", "many"}));
}

TEST_CASE("--event-poll-us: 0 by default, 0 to 1000000", "[server][options]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->event_poll_us == kDefaultEventPoll.count());
  auto set = parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "25"});
  REQUIRE(set);
  CHECK(set->event_poll_us == 25);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "-1"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "1000001"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--event-poll-us", "5us"}));
}

TEST_CASE("--priority-scheduling and its bounds (on, 2000 us, 4 records, 50 us by default)",
          "[server][options][priority]") {
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->priority_scheduling);
  CHECK(defaults->priority_max_hold_us == 2000);
  CHECK(defaults->priority_run_ahead == 4);
  CHECK(defaults->priority_fence_poll_us == 50);
  auto set = parse({"--device", "0", "--control-fd", "3", "--priority-scheduling", "off",
                    "--priority-max-hold-us", "500", "--priority-run-ahead", "16",
                    "--priority-fence-poll-us", "0"});
  REQUIRE(set);
  CHECK_FALSE(set->priority_scheduling);
  CHECK(set->priority_max_hold_us == 500);
  CHECK(set->priority_run_ahead == 16);
  CHECK(set->priority_fence_poll_us == 0);
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-fence-poll-us", "-5"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-scheduling", "maybe"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-max-hold-us", "0"}));
  CHECK_FALSE(parse({"--device", "0", "--control-fd", "3", "--priority-run-ahead", "0"}));
  CHECK(std::string(kUsage).find("--priority-scheduling on|off") != std::string::npos);
}

TEST_CASE("--priority-reserve-sms takes SMs, a percentage or off (18% by default)",
          "[server][options][priority][reserve]") {
  auto with = [](const char* value) {
    return parse({"--device", "0", "--control-fd", "3", "--priority-reserve-sms", value});
  };
  auto defaults = parse({"--device", "0", "--control-fd", "3"});
  REQUIRE(defaults);
  CHECK(defaults->priority_reserve_sms == SmReserveSpec{18, true});
  CHECK(with("16")->priority_reserve_sms == SmReserveSpec{16, false});
  CHECK(with("25%")->priority_reserve_sms == SmReserveSpec{25, true});
  CHECK(with("0")->priority_reserve_sms.amount == 0);
  CHECK(with("0%")->priority_reserve_sms == SmReserveSpec{});
  CHECK(with("off")->priority_reserve_sms == SmReserveSpec{});
  for (const char* bad : {"-8", "91%", "4097", "lots", "%", "", "16 ", "8SMs", "1.5%"}) {
    INFO(bad);
    auto refused = with(bad);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find(fmt::format("--priority-reserve-sms {}: expected a number of SMs",
                                           bad)) != std::string::npos);
  }
  CHECK(format_sm_reserve(*parse_sm_reserve("25%")) == "25%");
  CHECK(format_sm_reserve(*parse_sm_reserve("off")) == "0");
  CHECK(std::string(kUsage).find("--priority-reserve-sms N|P%") != std::string::npos);
}

}  // namespace mpsshim::server

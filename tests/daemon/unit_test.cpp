// The daemon's pure pieces: CUDA_VISIBLE_DEVICES as CUDA reads it, sizes as operators write them,
// options passed on to the servers.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "broker/daemon/allocations.hpp"
#include "broker/daemon/commands.hpp"
#include "broker/daemon/event_loop.hpp"
#include "broker/daemon/fault_log.hpp"
#include "broker/daemon/isolation.hpp"
#include "broker/daemon/log.hpp"
#include "broker/daemon/metrics.hpp"
#include "broker/daemon/options.hpp"
#include "broker/daemon/sizes.hpp"
#include "broker/daemon/supervisor.hpp"
#include "broker/daemon/visible_devices.hpp"

using namespace mpsshim::daemon;
namespace server = mpsshim::server;

namespace {

// mpsshimd's options from these arguments (the program name added).
// What mpsshimd passes to every server for `setting`; unset: not passed.
std::optional<std::string> passed(const DaemonOptions& options, server::Setting setting) {
  const std::string* value = options.server_settings.find(setting);
  return value != nullptr ? std::optional<std::string>(*value) : std::nullopt;
}

auto parse(std::vector<const char*> args) {
  args.insert(args.begin(), "mpsshimd");
  return parse_daemon_options(static_cast<int>(args.size()), const_cast<char**>(args.data()));
}

// Three GPUs whose UUIDs share the first byte: GPU-ab111111-..., GPU-ab222222-..., GPU-ab333333-...
std::vector<std::optional<GpuUuid>> three_gpus() {
  std::vector<std::optional<GpuUuid>> uuids;
  for (int gpu = 0; gpu < 3; ++gpu) {
    GpuUuid uuid;
    uuid.fill(static_cast<std::uint8_t>(0x11 * (gpu + 1)));
    uuid[0] = 0xab;
    uuids.emplace_back(uuid);
  }
  return uuids;
}

std::vector<int> visible(const char* spec) {
  return resolve_visible_devices(spec, three_gpus());
}

}  // namespace

TEST_CASE("a GPU UUID is printed as nvidia-smi prints it", "[visible]") {
  GpuUuid uuid{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
               0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77};
  CHECK(format_gpu_uuid(uuid) == "GPU-01234567-89ab-cdef-0011-223344556677");
}

TEST_CASE("CUDA_VISIBLE_DEVICES selects and orders GPUs as CUDA does", "[visible]") {
  CHECK(visible("") == std::vector{0, 1, 2});
  CHECK(visible("2,0") == std::vector{2, 0});
  CHECK(visible(" 1 , 2 ") == std::vector{1, 2});
  CHECK(visible("GPU-ab33,1") == std::vector{2, 1});
  CHECK(visible("gpu-AB2222") == std::vector{1});
  CHECK(visible("GPU-ab222222-2222-2222-2222-222222222222") == std::vector{1});
}

TEST_CASE("CUDA_VISIBLE_DEVICES ends at the first entry that names no single new GPU",
          "[visible]") {
  CHECK(visible("1,7,0") == std::vector{1});             // out of range
  CHECK(visible("0,-1,1") == std::vector{0});            // negative
  CHECK(visible("2,x,0") == std::vector{2});             // not a number
  CHECK(visible("0,1abc").size() == 1);                  // trailing junk
  CHECK(visible("1,1,0") == std::vector{1});             // a repeat
  CHECK(visible("GPU-ab,0").empty());                    // ambiguous prefix
  CHECK(visible("GPU-ff,0").empty());                    // no such UUID
  CHECK(visible("0,MIG-ab111111,1") == std::vector{0});  // MIG is not supported
  CHECK(visible("0,,1") == std::vector{0});              // empty item
}

TEST_CASE("a GPU whose UUID is not known yet can be named by index only", "[visible]") {
  auto uuids = three_gpus();
  uuids[1].reset();
  CHECK(resolve_visible_devices("1,0", uuids) == std::vector{1, 0});
  CHECK(resolve_visible_devices("GPU-ab22,0", uuids).empty());
}

TEST_CASE("sizes read as operators write them", "[sizes]") {
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("1536") == 1536u);
  CHECK(parse_size("4G") == 4ull << 30);
  CHECK(parse_size("4g") == 4ull << 30);
  CHECK(parse_size("512M") == 512ull << 20);
  CHECK(parse_size("512MiB") == 512ull << 20);
  CHECK(parse_size("2TB") == 2ull << 40);
  CHECK(parse_size("64K") == 64ull << 10);
  CHECK(parse_size("100B") == 100u);
  CHECK_FALSE(parse_size(""));
  CHECK_FALSE(parse_size("G"));
  CHECK_FALSE(parse_size("4X"));
  CHECK_FALSE(parse_size("4GG"));
  CHECK_FALSE(parse_size("-4G"));
  CHECK_FALSE(parse_size("99999999999T"));  // overflows 64 bits
}

TEST_CASE("sizes print in the largest exact unit", "[sizes]") {
  CHECK(format_size(0) == "0");
  CHECK(format_size(1536) == "1536");
  CHECK(format_size(4ull << 30) == "4G");
  CHECK(format_size(1536ull << 20) == "1536M");
  CHECK(format_size_approx(85899345920ull) == "80.0 GiB");
  CHECK(format_size_approx(512) == "512 B");
}

TEST_CASE("--server-launch-batch takes what a server's --launch-batch takes", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kLaunchBatch));
  auto off = parse({"--server-launch-batch", "0"});
  REQUIRE(off);
  CHECK(passed(*off, server::Setting::kLaunchBatch) == "0");
  auto sixteen = parse({"--server-launch-batch", "16"});
  REQUIRE(sixteen);
  CHECK(passed(*sixteen, server::Setting::kLaunchBatch) == "16");
  CHECK_FALSE(parse({"--server-launch-batch", "257"}));
  CHECK_FALSE(parse({"--server-launch-batch", "x"}));
  CHECK(daemon_usage().find("--server-launch-batch N") != std::string::npos);
}

TEST_CASE("--launch-batching off passes --launch-batch 0 on; on keeps a size chosen", "[options]") {
  auto off = parse({"--launch-batching", "off"});
  REQUIRE(off);
  CHECK(passed(*off, server::Setting::kLaunchBatch) == "0");
  auto on = parse({"--launch-batching", "on"});
  REQUIRE(on);
  CHECK_FALSE(passed(*on, server::Setting::kLaunchBatch));  // the server's default
  auto off_then_on = parse({"--launch-batching=off", "--launch-batching=on"});
  REQUIRE(off_then_on);
  CHECK_FALSE(passed(*off_then_on, server::Setting::kLaunchBatch));
  auto sized = parse({"--server-launch-batch", "16", "--launch-batching", "on"});
  REQUIRE(sized);
  CHECK(passed(*sized, server::Setting::kLaunchBatch) == "16");
  auto bad = parse({"--launch-batching", "maybe"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--launch-batching maybe") != std::string::npos);
  CHECK(daemon_usage().find("--launch-batching on|off") != std::string::npos);
}

TEST_CASE("--host-fences is on unless turned off", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kHostFences));  // the server's default: on
  auto off = parse({"--host-fences=off"});
  REQUIRE(off);
  CHECK(passed(*off, server::Setting::kHostFences) == "off");
  auto bad = parse({"--host-fences", "maybe"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--host-fences maybe") != std::string::npos);
  CHECK(daemon_usage().find("--host-fences on|off") != std::string::npos);
}

TEST_CASE("--launch-batch-ramp is the server's default unless given", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kLaunchBatchRamp));  // the server's default
  auto off = parse({"--launch-batch-ramp=off"});
  REQUIRE(off);
  CHECK(passed(*off, server::Setting::kLaunchBatchRamp) == "0");
  auto eight = parse({"--launch-batch-ramp", "8"});
  REQUIRE(eight);
  CHECK(passed(*eight, server::Setting::kLaunchBatchRamp) == "8");
  auto on = parse({"--launch-batch-ramp", "8", "--launch-batch-ramp", "on"});
  REQUIRE(on);
  CHECK(passed(*on, server::Setting::kLaunchBatchRamp) == "8");  // on: the table's ramp
  auto bad = parse({"--launch-batch-ramp", "sometimes"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--launch-batch-ramp") != std::string::npos);
  CHECK(daemon_usage().find("--launch-batch-ramp N|on|off") != std::string::npos);
}

TEST_CASE("--launch-batch-graphs is the server's default unless given", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kLaunchBatchGraphs));
  auto runs = parse({"--launch-batch-graphs=runs"});
  REQUIRE(runs);
  CHECK(passed(*runs, server::Setting::kLaunchBatchGraphs) == "runs");
  auto bad = parse({"--launch-batch-graphs", "all"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--launch-batch-graphs all") != std::string::npos);
  CHECK(daemon_usage().find("--launch-batch-graphs padded|runs|exact") != std::string::npos);
}

TEST_CASE("--crowded-fence-max-queued is the server's default unless given", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kCrowdedFenceMaxQueued));
  auto sixty_four = parse({"--crowded-fence-max-queued", "64"});
  REQUIRE(sixty_four);
  CHECK(passed(*sixty_four, server::Setting::kCrowdedFenceMaxQueued) == "64");
  CHECK_FALSE(parse({"--crowded-fence-max-queued", "-1"}));
  CHECK(daemon_usage().find("--crowded-fence-max-queued N") != std::string::npos);
}

TEST_CASE("--image-idle-timeout is the server's default unless given", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kImageIdleTimeout));
  auto zero = parse({"--image-idle-timeout", "0"});
  REQUIRE(zero);
  CHECK(passed(*zero, server::Setting::kImageIdleTimeout) == "0");
  CHECK_FALSE(parse({"--image-idle-timeout", "-1"}));
  CHECK_FALSE(parse({"--image-idle-timeout", "86401"}));
  CHECK(daemon_usage().find("--image-idle-timeout SECS") != std::string::npos);
}

TEST_CASE("--server-launch-batch-min is passed on as every server's --launch-batch-min",
          "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kLaunchBatchMin));
  auto sixteen = parse({"--server-launch-batch-min", "16"});
  REQUIRE(sixteen);
  CHECK(passed(*sixteen, server::Setting::kLaunchBatchMin) == "16");
  CHECK_FALSE(parse({"--server-launch-batch-min", "1"}));
  CHECK_FALSE(parse({"--server-launch-batch-min", "257"}));
  CHECK(daemon_usage().find("--server-launch-batch-min N") != std::string::npos);
}

TEST_CASE("--metrics-listen takes a port, IPv4:port or [IPv6]:port", "[options][metrics]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(unset->metrics_listen);

  auto bare = parse({"--metrics-listen", "9400"});
  REQUIRE(bare);
  REQUIRE(bare->metrics_listen);
  CHECK(bare->metrics_listen->host == "127.0.0.1");
  CHECK_FALSE(bare->metrics_listen->ipv6);
  CHECK(bare->metrics_listen->port == 9400);

  auto any = parse({"--metrics-listen=0.0.0.0:9400"});
  REQUIRE(any);
  CHECK(format_metrics_address(*any->metrics_listen) == "0.0.0.0:9400");

  auto v6 = parse({"--metrics-listen", "[::1]:9401"});
  REQUIRE(v6);
  CHECK(v6->metrics_listen->ipv6);
  CHECK(v6->metrics_listen->host == "::1");
  CHECK(format_metrics_address(*v6->metrics_listen) == "[::1]:9401");

  auto ephemeral = parse({"--metrics-listen", "127.0.0.1:0"});
  REQUIRE(ephemeral);
  CHECK(ephemeral->metrics_listen->port == 0);

  for (const char* bad :
       {"", "x", "65536", "-1", "9400x", "localhost:9400", "1.2.3:9400", "127.0.0.1:", "::1:9400",
        "[::1]", "[::1]9400", "[1.2.3.4]:9400", "[::1]:70000"}) {
    INFO("--metrics-listen " << bad);
    auto parsed = parse({"--metrics-listen", bad});
    REQUIRE_FALSE(parsed);
    CHECK(parsed.error().find("--metrics-listen") != std::string::npos);
    CHECK(parsed.error().find("e.g. 9400, 127.0.0.1:9400") != std::string::npos);
  }
  CHECK(daemon_usage().find("--metrics-listen [ADDR:]PORT") != std::string::npos);
}

TEST_CASE("label values are escaped as the exposition format wants", "[metrics]") {
  CHECK(escape_label_value("python3") == "python3");
  CHECK(escape_label_value(R"(a\b"c)") == R"(a\\b\"c)");
  CHECK(escape_label_value("two\nlines") == R"(two\nlines)");
  CHECK(escape_label_value("caf\xc3\xa9 \xe2\x82\xac") ==
        "caf\xc3\xa9 \xe2\x82\xac");                                          // UTF-8 kept
  CHECK(escape_label_value("bad\xff\xc3") == "bad\xef\xbf\xbd\xef\xbf\xbd");  // not UTF-8
  CHECK(escape_label_value("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
}

TEST_CASE("a scrape lists every family with HELP and TYPE and leaves unlimited memory out",
          "[metrics]") {
  MetricsInput input;
  input.start_time_seconds = 1700000000.5;
  input.version = "0.1.0";
  input.abi_major = 1;
  input.abi_minor = 2;
  ServerStatus running;
  running.state = ServerState::kRunning;
  running.restarts = 2;
  running.gpu_faults = 1;
  ServerStatus failed;
  failed.ordinal = 1;
  failed.state = ServerState::kFailed;
  input.servers = {running, failed};
  input.reports.ps = {{0,
                       "client=3 pid=7 uid=no-such-user program=a\"b\\c sms=8 mem_used=10 "
                       "mem_limit=0 launches=5 state=active\n"
                       "client=4 pid=8 uid=x program=p mem_limit=4096 launches=1\nnote\n"}};
  input.reports.stats = {{0, "client=3 pid=7 uid=no-such-user program=p server_us=1500000\n"}};

  std::string text = format_metrics(input);

  for (const char* family :
       {"mpsshim_daemon_start_time_seconds gauge", "mpsshim_build_info gauge",
        "mpsshim_server_up gauge", "mpsshim_server_restarts_total counter",
        "mpsshim_server_gpu_faults_total counter", "mpsshim_server_clients gauge",
        "mpsshim_client_launches_total counter", "mpsshim_client_memory_limit_bytes gauge",
        "mpsshim_client_server_seconds_total counter"}) {
    INFO(family);
    CHECK(text.find(std::string("# TYPE ") + family + "\n") != std::string::npos);
  }
  CHECK(text.find("mpsshim_daemon_start_time_seconds 1700000000.5\n") != std::string::npos);
  CHECK(text.find("mpsshim_build_info{version=\"0.1.0\",abi=\"1.2\"} 1\n") != std::string::npos);
  CHECK(text.find("mpsshim_server_up{gpu=\"0\"} 1\nmpsshim_server_up{gpu=\"1\"} 0\n") !=
        std::string::npos);
  CHECK(text.find("mpsshim_server_restarts_total{gpu=\"0\"} 2\n") != std::string::npos);
  CHECK(text.find("mpsshim_server_gpu_faults_total{gpu=\"0\"} 1\n") != std::string::npos);
  CHECK(text.find("mpsshim_server_clients{gpu=\"0\"} 2\n") != std::string::npos);
  CHECK(text.find("mpsshim_server_clients{gpu=\"1\"}") == std::string::npos);  // no answer
  CHECK(text.find("mpsshim_server_scrape_answered{gpu=\"1\"} 0\n") != std::string::npos);
  CHECK(text.find("mpsshim_client_launches_total{gpu=\"0\",client=\"3\",pid=\"7\","
                  "user=\"no-such-user\",program=\"a\\\"b\\\\c\"} 5\n") != std::string::npos);
  // 0 means no limit: no sample for client 3; client 4 has one.
  CHECK(text.find("mpsshim_client_memory_limit_bytes{gpu=\"0\",client=\"3\"") == std::string::npos);
  CHECK(text.find("mpsshim_client_memory_limit_bytes{gpu=\"0\",client=\"4\",pid=\"8\",user=\"x\","
                  "program=\"p\"} 4096\n") != std::string::npos);
  CHECK(text.find("mpsshim_client_server_seconds_total{gpu=\"0\",client=\"3\",pid=\"7\","
                  "user=\"no-such-user\",program=\"p\"} 1.5\n") != std::string::npos);
}

TEST_CASE("--priority-reserve-sms is checked and passed on to every server", "[options]") {
  auto unset = parse({});
  REQUIRE(unset);
  CHECK_FALSE(passed(*unset, server::Setting::kPriorityReserveSms));  // the servers' default
  CHECK(passed(*parse({"--priority-reserve-sms", "16"}), server::Setting::kPriorityReserveSms) ==
        "16");
  CHECK(passed(*parse({"--priority-reserve-sms=12%"}), server::Setting::kPriorityReserveSms) ==
        "12%");
  CHECK(passed(*parse({"--priority-reserve-sms", "off"}), server::Setting::kPriorityReserveSms) ==
        "0");
  auto bad = parse({"--priority-reserve-sms", "95%"});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().find("--priority-reserve-sms 95%: expected") != std::string::npos);
  CHECK_FALSE(parse({"--priority-reserve-sms", "some"}));
  CHECK(daemon_usage().find("--priority-reserve-sms N|P%") != std::string::npos);
  CHECK_FALSE(passed(*unset, server::Setting::kPriorityFencePollUs));
  CHECK(passed(*parse({"--priority-fence-poll-us", "0"}), server::Setting::kPriorityFencePollUs) ==
        "0");
  CHECK(passed(*parse({"--priority-fence-poll-us", "250"}),
               server::Setting::kPriorityFencePollUs) == "250");
  CHECK_FALSE(parse({"--priority-fence-poll-us", "-1"}));
  CHECK_FALSE(parse({"--priority-fence-poll-us", "2000000"}));
  CHECK(daemon_usage().find("--priority-fence-poll-us N") != std::string::npos);
}

TEST_CASE("--client-limit checks the name and passes sizes on in bytes", "[options]") {
  auto sut = parse({"--client-limit", "streams=64", "--client-limit", "pinned=4G"});
  REQUIRE(sut);
  CHECK(sut->server_settings.arguments() == std::vector<std::string>{"--client-limit", "streams=64",
                                                                     "--client-limit",
                                                                     "pinned=4294967296"});
  auto unknown = parse({"--client-limit", "fridges=3"});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().find("streams, events") != std::string::npos);
  CHECK_FALSE(parse({"--client-limit", "streams"}));
  CHECK_FALSE(parse({"--client-limit", "streams=4K"}));  // a count, not a size
  CHECK_FALSE(parse({"--client-limit", "pinned=lots"}));
}

namespace mpsshim::daemon {
namespace {

// Found by tests/fuzz/fuzz_limits: a command line that is not UTF-8, answered with --json, threw
// out of nlohmann's dump and took the daemon down.
TEST_CASE("a --json answer to a command that is not UTF-8 is given, not thrown", "[commands]") {
  EventLoop loop;
  SupervisorConfig config;
  config.server_path = "/nonexistent/mpsshim-server";
  Supervisor supervisor(loop, config, {});
  AllocationRegistry allocations;
  Commands commands(supervisor, allocations, [] {});
  std::vector<CtlReply> replies;
  commands.execute("1\xb9gpu+_states\xd3 --json", [&](CtlReply r) { replies.push_back(r); });
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].status != 0);
  // Valid JSON: the bad byte is replaced.
  auto parsed = nlohmann::json::parse(replies[0].text, nullptr, false);
  REQUIRE_FALSE(parsed.is_discarded());
  CHECK(parsed["ok"] == false);
  CHECK(replies[0].text.find("\xef\xbf\xbd") != std::string::npos);  // U+FFFD in place of 0xB9
}

}  // namespace
}  // namespace mpsshim::daemon

TEST_CASE("isolation groups: the operator's rule places a client; a client can only add isolation",
          "[isolation]") {
  using mpsshim::daemon::isolation_group;
  using mpsshim::daemon::IsolationRule;
  const mpsshim::proto::PeerCredentials peer{4123, 1000, 1000};
  mpsshim::proto::ClientHello hello{};
  CHECK(isolation_group(IsolationRule::kShared, peer, hello, 7).empty());
  CHECK(isolation_group(IsolationRule::kUser, peer, hello, 7) == "uid:1000");
  CHECK(isolation_group(IsolationRule::kAllocation, peer, hello, 7) == "allocation:7");
  CHECK(isolation_group(IsolationRule::kAllocation, peer, hello, 0).empty());  // no pod: shared
  CHECK(isolation_group(IsolationRule::kClient, peer, hello, 0) == "client:4123");
  hello.flags = mpsshim::proto::kHelloOwnIsolationGroup;
  for (IsolationRule rule : {IsolationRule::kShared, IsolationRule::kUser,
                             IsolationRule::kAllocation, IsolationRule::kClient}) {
    CHECK(isolation_group(rule, peer, hello, 7) == "client:4123");
  }
  CHECK(mpsshim::daemon::parse_isolation_rule("allocation") == IsolationRule::kAllocation);
  CHECK_FALSE(mpsshim::daemon::parse_isolation_rule("pod").has_value());
}

TEST_CASE("ps text of an isolation group's server carries the group on each client line",
          "[isolation]") {
  const std::string text = "client=3 pid=10 uid=0\ntruncated: more\nclient=4 pid=11 uid=0\n";
  CHECK(mpsshim::daemon::with_isolation_group(text, "") == text);
  CHECK(mpsshim::daemon::with_isolation_group(text, "uid:5") ==
        "client=3 pid=10 uid=0 isolation_group=uid:5\ntruncated: more\n"
        "client=4 pid=11 uid=0 isolation_group=uid:5\n");
}

TEST_CASE("a server's fault report is read field by field; the program takes the rest",
          "[faults]") {
  auto report = parse_fault_report(
      "client=4 pid=1131 uid=1000 clients=2 op=CtxSynchronize error=CUDA_ERROR_ILLEGAL_ADDRESS "
      "program=my job.py --x=1",
      700);
  REQUIRE(report);
  CHECK(report->client == 4);
  CHECK(report->pid == 1131);
  CHECK(report->uid == 1000);
  CHECK(report->clients_ended == 2);
  CHECK(report->op == "CtxSynchronize");
  CHECK(report->error == 700);
  CHECK(report->error_name == "CUDA_ERROR_ILLEGAL_ADDRESS");
  CHECK(report->program == "my job.py --x=1");

  CHECK_FALSE(parse_fault_report("client=4 pid=x uid=0 clients=1 op=- error=E program=p", 700));
  CHECK_FALSE(parse_fault_report("client=4 pid=1 uid=0", 700));  // no program=
  // A newer server's extra key is skipped; a missing error name says the number.
  auto newer = parse_fault_report("client=0 pid=0 uid=0 clients=3 colour=red program=", 719);
  REQUIRE(newer);
  CHECK(newer->error_name == "CUresult 719");
  CHECK(newer->program.empty());
  CHECK(describe_fault(*newer).find("no client's call returned it first") != std::string::npos);
}

TEST_CASE("the fault log keeps the recent reports and counts culprits by uid and program",
          "[faults]") {
  FaultLog log;
  const Clock::time_point t0 = Clock::now();
  for (std::size_t i = 0; i < FaultLog::kKept + 3; ++i) {
    FaultReport r;
    r.gpu = static_cast<int>(i % 2);
    r.client = 1;
    r.pid = static_cast<pid_t>(100 + i);
    r.uid = 4242;
    r.program = "train.py";
    r.seen = t0;
    log.add(r);
  }
  FaultReport anonymous;  // no culprit: listed, not counted
  anonymous.seen = t0;
  log.add(anonymous);
  CHECK(log.recent().size() == FaultLog::kKept);
  CHECK(log.recent().back().client == 0);
  CHECK(log.by_culprit().at({0, 4242, "train.py"}) == (FaultLog::kKept + 4) / 2);
  CHECK(log.by_culprit().at({1, 4242, "train.py"}) == (FaultLog::kKept + 3) / 2);
  CHECK(log.by_culprit().size() == 2);

  auto found =
      log.recent_culprit(4242, "train.py", t0 + std::chrono::seconds(30), std::chrono::seconds(60));
  REQUIRE(found);
  CHECK(found->pid == static_cast<pid_t>(100 + FaultLog::kKept + 2));
  CHECK_FALSE(log.recent_culprit(4242, "train.py", t0 + std::chrono::seconds(61),
                                 std::chrono::seconds(60)));
  CHECK_FALSE(log.recent_culprit(1001, "train.py", t0, std::chrono::seconds(60)));
  CHECK_FALSE(log.recent_culprit(4242, "serve.py", t0, std::chrono::seconds(60)));

  MetricsInput input;
  input.client_faults = log.by_culprit();
  const std::string text = format_metrics(input);
  CHECK(text.find("# TYPE mpsshim_client_faults_total counter") != std::string::npos);
  CHECK(text.find("mpsshim_client_faults_total{gpu=\"1\",user=\"4242\",program=\"train.py\"} " +
                  std::to_string((FaultLog::kKept + 3) / 2) + "\n") != std::string::npos);
}

TEST_CASE("--isolate-after-fault takes seconds, 0 turning it off", "[options][faults]") {
  auto on = parse({"--isolate-after-fault", "600"});
  REQUIRE(on);
  CHECK(on->isolate_after_fault == std::chrono::seconds(600));
  auto off = parse({});
  REQUIRE(off);
  CHECK(off->isolate_after_fault == std::chrono::seconds(0));
  CHECK_FALSE(parse({"--isolate-after-fault", "-1"}));
  CHECK_FALSE(parse({"--isolate-after-fault", "soon"}));
}

namespace mpsshim::daemon {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The one log as mpsshimd and its servers configure it (common/log.hpp): a time stamp, the
// program and its pid or tag, the level; one line per event; a disabled level is not written;
// a sink takes the bare message. Restores stderr and the default level afterwards.
TEST_CASE("the daemon's log lines: time, program[pid], level, one line per event", "[log]") {
  char path[] = "/tmp/mpsshimd-log-test-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  configure_daemon_log("mpsshimd-test");
  set_log_level(LogLevel::kInfo);
  REQUIRE(open_log_file(path));
  log_warn("server for GPU {} exited\nwith status {}", 1, 70);
  log_debug("not written at info");
  std::vector<std::string> sunk;
  set_log_sink([&](LogLevel level, std::string_view line) {
    sunk.push_back(fmt::format("{}|{}", log_level_name(level), line));
  });
  log_error("to the sink");
  set_log_sink(nullptr);
  log_info("back in the file");
  set_log_fd(STDERR_FILENO);
  const std::string text = read_all(path);
  ::unlink(path);

  const std::regex line(
      R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} mpsshimd-test\[(\d+)\] (\w+): ([^\n]*)\n)");
  std::vector<std::string> seen;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    CHECK((*it)[1] == std::to_string(::getpid()));
    seen.push_back(fmt::format("{}|{}", (*it)[2].str(), (*it)[3].str()));
  }
  CHECK(seen == std::vector<std::string>{"warn|server for GPU 1 exited with status 70",
                                         "info|back in the file"});
  CHECK(sunk == std::vector<std::string>{"error|to the sink"});
  CHECK(parse_log_level("Warning") == LogLevel::kWarn);
  CHECK(parse_log_level("trace") == LogLevel::kTrace);
  CHECK_FALSE(parse_log_level("loud"));
}

}  // namespace
}  // namespace mpsshim::daemon

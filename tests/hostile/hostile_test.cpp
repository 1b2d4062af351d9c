// Hostile clients on the real protocol: each scenario of hostile_client.cpp runs against a real
// mpsshimd -> mpsshim-server on the test driver while a well-behaved client (the e2e client's
// stress mode under the shim, every element checked) works alongside. For each: the hostile
// client saw a refusal or its session end, the log says why in a line naming its pid, the
// well-behaved client passes, the server was never restarted, and its fds and the test
// driver's objects and device bytes are back to the idle baseline.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <thread>

#include "baseline.hpp"

using namespace mpsshim::e2e;
using namespace mpsshim::hostile_test;
using namespace std::chrono_literals;

namespace {

// Low caps, so that each flood reaches its cap quickly. The well-behaved client stays well
// under them (two streams, one module, three allocations at a time, 192 KiB pinned).
const std::vector<std::string> kLimits = {
    "--client-limit",   "streams=16",     "--client-limit", "events=32",      "--client-limit",
    "modules=8",        "--client-limit", "graphs=8",       "--client-limit", "memory-pools=4",
    "--client-limit",   "allocations=64", "--client-limit", "pinned=4M",      "--client-limit",
    "host-functions=8", "--client-limit", "in-flight=32",
};

struct Attack {
  std::vector<std::string> args;  // the scenario and its arguments
  std::string log_text;           // what the daemon's or the server's log must say
};

class Fixture {
 public:
  Fixture() : stats_path_(make_stats_path()), daemon_(daemon_args(), stats_env(stats_path_)) {
    // A first client has been served, so the baseline is the idle server every later
    // measurement returns to. With --context-idle-timeout 0 the server releases the primary
    // context as soon as no client is left, and empties its green-context pool before
    // (green_context_pool.hpp): at rest it keeps no green context, so the test driver's objects
    // come back to exactly the baseline, green contexts included.
    Outcome warm = run_client(daemon_, {artefact("E2E_CLIENT"), "basic"});
    REQUIRE(warm.exit_code == 0);
    baseline_ = take_baseline(daemon_, stats_path_);
    INFO(baseline_.unsettled);
    REQUIRE(baseline_.unsettled.empty());
    REQUIRE(baseline_.driver.live_objects >= 0);
  }
  ~Fixture() { std::remove(stats_path_.c_str()); }

  const Daemon& daemon() const { return daemon_; }
  // What is not back to the idle baseline ("" when everything is).
  std::string leaks() const { return differences_from(daemon_, stats_path_, baseline_); }

  // Runs the attack with a well-behaved client working alongside, and checks everything.
  void run(const Attack& attack) {
    INFO("scenario " << attack.args[0]);
    Child bystander({artefact("E2E_CLIENT"), "stress", "0"}, daemon_.client_env(), true);
    REQUIRE(bystander.wait_for_output("READY", 60s));

    std::vector<std::string> argv = {artefact("HOSTILE_CLIENT"), daemon_.dir()};
    argv.insert(argv.end(), attack.args.begin(), attack.args.end());
    Child hostile(argv, {});
    const pid_t pid = hostile.pid();
    Outcome h = hostile.wait(60s);
    INFO("hostile client: " << h.out << h.err);
    CHECK(h.exit_code == 0);
    CHECK(h.out.find("PASS " + attack.args[0]) != std::string::npos);

    bystander.close_stdin();
    Outcome b = bystander.wait(60s);
    INFO("well-behaved client: " << b.out << b.err);
    CHECK(b.exit_code == 0);
    CHECK(b.out.find("PASS stress") != std::string::npos);

    std::string line = log_line(daemon_, pid, attack.log_text);
    INFO("log:\n" << daemon_.log());
    CHECK(!line.empty());
    CHECK(leaks() == "");
  }

  // Starts the victim of the forgery scenarios; its objects as hostile_client arguments.
  std::vector<std::string> start_victim(std::unique_ptr<Child>& victim) {
    victim = std::make_unique<Child>(
        std::vector<std::string>{artefact("HOSTILE_CLIENT"), daemon_.dir(), "victim"},
        std::map<std::string, std::string>{}, true);
    REQUIRE(victim->wait_for_output("VICTIM", 30s));
    std::smatch m;
    std::string out = victim->out();
    REQUIRE(
        std::regex_search(out, m,
                          std::regex("dptr=(0x[0-9a-f]+) stream=(0x[0-9a-f]+) event=(0x[0-9a-f]+) "
                                     "ctx=(0x[0-9a-f]+)")));
    return {m[1], m[2], m[3], m[4]};
  }

 private:
  static std::string make_stats_path() {
    char pattern[] = "/tmp/mpsshim-hostile-stats-XXXXXX";
    int fd = ::mkstemp(pattern);
    if (fd >= 0) ::close(fd);
    return pattern;
  }
  static std::vector<std::string> daemon_args() {
    std::vector<std::string> args = {"--server-workers", "2", "--context-idle-timeout", "0"};
    args.insert(args.end(), kLimits.begin(), kLimits.end());
    return args;
  }

  std::string stats_path_;
  Daemon daemon_;
  Baseline baseline_;
};

}  // namespace

TEST_CASE("wrong hellos are refused by the daemon with a log line", "[hostile][hello]") {
  Fixture sut;
  for (const Attack& attack : std::vector<Attack>{
           {{"bad-magic"}, "sent something that is not mpsshim's protocol"},
           {{"wrong-abi"}, "client speaks mpsshim ABI 99."},
           {{"truncated-hello"}, "sent a truncated message of kind 3 (100 bytes)"},
           {{"oversized-hello"}, "sent a 65536-byte hello whose header says 65536 bytes"},
           {{"hello-size-lies"}, "sent a 432-byte hello whose header says 200 bytes"},
           {{"hello-with-fds"}, "sent 2 file descriptor(s) with its first message"},
       }) {
    sut.run(attack);
  }
}

TEST_CASE("records and messages that break the protocol end only their own session",
          "[hostile][protocol]") {
  Fixture sut;
  for (const Attack& attack : std::vector<Attack>{
           {{"unknown-opcode"}, "sent unknown opcode 4000; ending its session"},
           {{"truncated-record"}, "sent a MemAlloc record with 0 payload bytes; it needs 16"},
           {{"oversized-record"}, "sent a 131088-byte record, more than any operation needs"},
           {{"record-size-lies"}, "corrupted its request ring; ending its session"},
           {{"record-past-head"}, "corrupted its request ring; ending its session"},
           {{"head-backwards"}, "corrupted its request ring; ending its session"},
           {{"head-past-writer"}, "corrupted its request ring; ending its session"},
           {{"reply-slot-out-of-range"}, "named reply slot 1048576 of a Ping with only 64 slots"},
           {{"socket-garbage"}, "sent a 100-byte socket message; only fd transfers are expected"},
           {{"fd-transfer-without-fd"}, "sent a malformed fd transfer (kind 8, 0 fds)"},
           {{"fd-transfer-three-fds"}, "sent a malformed fd transfer (kind 8, 3 fds)"},
           {{"write-after-hangup"}, "hostile) disconnected"},
       }) {
    sut.run(attack);
  }
}

TEST_CASE("floods stop at the per-client caps with a log line naming the option",
          "[hostile][caps]") {
  Fixture sut;
  auto cap_line = [](const std::string& name) {
    return "(per-client limit `" + name + "`; raise it with mpsshimd --client-limit " + name +
           "=N)";
  };
  for (const Attack& attack : std::vector<Attack>{
           {{"flood-streams", "16"}, cap_line("streams")},
           {{"flood-events", "32"}, cap_line("events")},
           {{"flood-modules", "8"}, cap_line("modules")},
           {{"flood-graphs", "8"}, cap_line("graphs")},
           {{"flood-memory-pools", "4"}, cap_line("memory-pools")},
           {{"flood-allocations", "64"}, cap_line("allocations")},
           {{"flood-pinned", std::to_string(4 << 20)}, cap_line("pinned")},
           {{"flood-host-functions", "8"}, cap_line("host-functions")},
           {{"flood-in-flight", "32"},
            "(per-client limit `in-flight`; raise it with mpsshimd --client-limit in-flight=N)"},
       }) {
    sut.run(attack);
  }
}

TEST_CASE("another client's pointers and handles are refused and its memory stays its own",
          "[hostile][forge]") {
  Fixture sut;
  std::unique_ptr<Child> victim;
  std::vector<std::string> args = {"forge"};
  for (const std::string& value : sut.start_victim(victim)) args.push_back(value);
  const std::string forger_log = "which is not one of its own; refused";
  {
    // Not through Fixture::run: the victim is still attached, so the baseline comes after.
    std::vector<std::string> argv = {artefact("HOSTILE_CLIENT"), sut.daemon().dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    Child bystander({artefact("E2E_CLIENT"), "stress", "0"}, sut.daemon().client_env(), true);
    REQUIRE(bystander.wait_for_output("READY", 60s));
    Child forger(argv, {});
    const pid_t pid = forger.pid();
    Outcome f = forger.wait(60s);
    INFO("forger: " << f.out << f.err);
    CHECK(f.exit_code == 0);
    CHECK(!log_line(sut.daemon(), pid, forger_log).empty());
    bystander.close_stdin();
    Outcome b = bystander.wait(60s);
    CHECK(b.out.find("PASS stress") != std::string::npos);
  }
  victim->close_stdin();
  Outcome v = victim->wait(60s);
  INFO("victim: " << v.out << v.err);
  CHECK(v.exit_code == 0);
  CHECK(v.out.find("PASS victim") != std::string::npos);
  CHECK(sut.leaks() == "");
}

// Isolation groups through the whole path on the CPU (docs/isolation.md): e2e_client under
// LD_PRELOAD=libmpsshim.so -> mpsshimd -> the shared server or a group's own mpsshim-server ->
// the host-memory test driver, whose kernels fault on an address their process does not hold,
// as a GPU's do.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <csignal>

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

// The bits of the float the victim fills its buffer with (pi): what a peek that reached it
// reads back.
constexpr const char* kSecret = "0x40490fdb";

struct GroupServer {
  int gpu = -1;
  int pid = -1;
  std::string state;
  std::string group;
};

// The isolation groups' lines of `mpsshimctl server_list` (GPU PID STATE RESTARTS ISOLATION).
std::vector<GroupServer> group_servers(const Daemon& daemon) {
  std::vector<GroupServer> out;
  std::istringstream lines(daemon.ctl({"server_list"}).out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    GroupServer s;
    int restarts = 0;
    if (fields >> s.gpu >> s.pid >> s.state >> restarts >> s.group && s.group != "shared") {
      out.push_back(s);
    }
  }
  return out;
}

// The ISOLATION column of `mpsshimctl ps` for client `pid` ("" when it is not listed).
std::string isolation_of(const Daemon& daemon, int pid) {
  std::istringstream lines(daemon.ctl({"ps"}).out);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    int listed = 0;
    if (!(fields >> listed) || listed != pid) continue;
    std::vector<std::string> words;
    for (std::string word; fields >> word;) words.push_back(word);
    return words.empty() ? "" : words.back();
  }
  return "";
}

struct Victim {
  std::unique_ptr<Child> child;
  std::string address;
};

Victim start_victim(const Daemon& daemon) {
  Victim v;
  v.child = std::make_unique<Child>(std::vector<std::string>{artefact("E2E_CLIENT"), "victim"},
                                    daemon.client_env(), true);
  INFO("victim: " << v.child->out() << v.child->err() << "\ndaemon log:\n" << daemon.log());
  REQUIRE(v.child->wait_for_output(" END", 60s));
  std::smatch m;
  const std::string out = v.child->out();
  REQUIRE(std::regex_search(out, m, std::regex("VICTIM ([0-9]+)")));
  v.address = m[1];
  return v;
}

}  // namespace

TEST_CASE("in the shared group a kernel given another client's address reads its memory",
          "[e2e][isolation]") {
  // What sharing a context means, shown so that the isolated case below is known to test
  // something: the same peek, without isolation, reaches the secret.
  Daemon daemon;
  Victim victim = start_victim(daemon);
  Child peek({artefact("E2E_CLIENT"), "peek", victim.address}, daemon.client_env(), true);
  REQUIRE(peek.wait_for_output("READY", 60s));
  CHECK(isolation_of(daemon, peek.pid()) == "shared");
  peek.close_stdin();
  Outcome peeked = peek.wait(60s);
  INFO("peek: " << peeked.out << peeked.err << "\ndaemon log:\n" << daemon.log());
  CHECK(peeked.out.find(std::string("sync=0 read=") + kSecret) != std::string::npos);
  CHECK(group_servers(daemon).empty());
  victim.child->close_stdin();
  require_pass(victim.child->wait(60s), daemon);
}

TEST_CASE(
    "MPSSHIM_ISOLATION=own: the client's own server; its kernel faults on another client's "
    "address, and only its own server ends",
    "[e2e][isolation]") {
  Daemon daemon;
  const ServerLine shared = server_line(daemon);
  Victim victim = start_victim(daemon);
  Child peek({artefact("E2E_CLIENT"), "peek", victim.address},
             daemon.client_env({{"MPSSHIM_ISOLATION", "own"}}), true);
  {
    INFO("peek: " << peek.out() << peek.err() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(peek.wait_for_output("READY", 60s));
  }
  const std::string group = "client:" + std::to_string(peek.pid());
  auto groups = group_servers(daemon);
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].group == group);
  CHECK(groups[0].state == "running");
  CHECK(groups[0].pid != shared.pid);
  CHECK(isolation_of(daemon, peek.pid()) == group);
  CHECK(isolation_of(daemon, victim.child->pid()) == "shared");

  peek.close_stdin();
  Outcome peeked = peek.wait(60s);
  INFO("peek: " << peeked.out << peeked.err << "\ndaemon log:\n" << daemon.log());
  // Its server's context has no memory at that address: an illegal address, as on a GPU.
  CHECK(peeked.out.find("PEEK launch=0") != std::string::npos);
  CHECK(peeked.out.find("sync=0") == std::string::npos);
  CHECK(peeked.out.find(kSecret) == std::string::npos);
  // The fault ended the group's server only; the shared one and its client never noticed.
  CHECK(eventually([&] { return group_servers(daemon).empty(); }));
  CHECK(daemon.log().find("isolation group " + group + " (pid " + std::to_string(groups[0].pid) +
                          ") exited with status 70 (GPU fault)") != std::string::npos);
  victim.child->close_stdin();
  require_pass(victim.child->wait(60s), daemon);
  const ServerLine after = server_line(daemon);
  CHECK(after.pid == shared.pid);
  CHECK(after.restarts == 0);
}

TEST_CASE(
    "--isolation user: one server for the uid's clients, stopped when idle, started again for "
    "the next",
    "[e2e][isolation]") {
  Daemon daemon({"--isolation", "user", "--isolation-idle-timeout", "1"});
  const std::string group = "uid:" + std::to_string(::getuid());
  Child first({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
  Child second({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
  {
    INFO("daemon log:\n" << daemon.log());
    REQUIRE(first.wait_for_output("READY", 60s));
    REQUIRE(second.wait_for_output("READY", 60s));
  }
  auto groups = group_servers(daemon);
  REQUIRE(groups.size() == 1);  // both clients on one server of their uid's group
  CHECK(groups[0].group == group);
  CHECK(isolation_of(daemon, first.pid()) == group);
  CHECK(isolation_of(daemon, second.pid()) == group);
  const int pid = groups[0].pid;
  first.kill(SIGKILL);
  second.kill(SIGKILL);
  first.wait(30s);
  second.wait(30s);
  // Without clients for --isolation-idle-timeout, the group's server is stopped...
  INFO("daemon log:\n" << daemon.log());
  CHECK(eventually([&] { return group_servers(daemon).empty(); }));
  CHECK(daemon.log().find("has had no clients for") != std::string::npos);
  // ... and the group's next client starts a new one, and runs.
  Outcome again = run_client(daemon, {artefact("E2E_CLIENT"), "basic", "4096"});
  require_pass(again, daemon);
  const std::string started = "isolation group " + group + " has its first client of GPU 0";
  const std::string log = daemon.log();
  const auto first_start = log.find(started);
  REQUIRE(first_start != std::string::npos);
  CHECK(log.find(started, first_start + 1) != std::string::npos);  // a second server started
  CHECK(log.find("(pid " + std::to_string(pid) + ") has had no clients for") != std::string::npos);
}

TEST_CASE("--isolation-max-servers: a group beyond the cap is refused with the reason",
          "[e2e][isolation]") {
  Daemon daemon({"--isolation", "client", "--isolation-max-servers", "1"});
  Child holder({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
  REQUIRE(holder.wait_for_output("READY", 60s));
  Outcome refused = run_client(daemon, {artefact("E2E_CLIENT"), "basic", "16"});
  INFO("refused: " << refused.out << refused.err << "\ndaemon log:\n" << daemon.log());
  CHECK(refused.exit_code != 0);
  CHECK(daemon.log().find("--isolation-max-servers") != std::string::npos);
  holder.close_stdin();
  holder.wait(60s);
}

TEST_CASE("a GPU fault names its likely culprit to every client, in the log and in ps",
          "[e2e][isolation][culprit]") {
  Daemon daemon;
  Victim bystander = start_victim(daemon);
  Child culprit({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
  {
    INFO("culprit: " << culprit.out() << culprit.err() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(culprit.wait_for_output("READY", 60s));
  }
  const std::string pid = std::to_string(culprit.pid());
  culprit.close_stdin();
  Outcome faulted = culprit.wait(60s);
  bystander.child->close_stdin();
  Outcome ended = bystander.child->wait(60s);
  INFO("culprit: " << faulted.out << faulted.err << "\nbystander: " << ended.out << ended.err
                   << "\ndaemon log:\n"
                   << daemon.log());
  CHECK(faulted.out.find("PEEK launch=0 sync=700") != std::string::npos);
  CHECK(faulted.err.find("this process's own work (e2e_client) returned it first: its likely "
                         "cause") != std::string::npos);
  // The bystander shared the server, so the fault ended it too; it is told whose work it was.
  CHECK(ended.exit_code != 0);
  CHECK(ended.err.find("the work of another client, pid " + pid +
                       " (e2e_client), returned it first: its likely cause") != std::string::npos);
  const std::string named = "first returned by the work of client pid " + pid +
                            " (e2e_client, uid " + std::to_string(::getuid()) +
                            "), its likely cause; 2 client(s) ended";
  CHECK(eventually([&] { return daemon.log().find(named) != std::string::npos; }));
  CHECK(daemon.ctl({"ps"}).out.find("GPU fault on GPU 0 (CUDA_ERROR_ILLEGAL_ADDRESS) at ") !=
        std::string::npos);
  CHECK(daemon.ctl({"ps"}).out.find(named) != std::string::npos);
  const auto json = nlohmann::json::parse(daemon.ctl({"ps", "--json"}).out);
  REQUIRE(json["faults"].size() == 1);
  const auto& fault = json["faults"][0];
  CHECK(fault["gpu"] == 0);
  CHECK(fault["error"] == "CUDA_ERROR_ILLEGAL_ADDRESS");
  CHECK(fault["isolation_group"] == "shared");
  CHECK(fault["clients_ended"] == 2);
  CHECK(fault["likely_culprit"]["pid"] == culprit.pid());
  CHECK(fault["likely_culprit"]["program"] == "e2e_client");
  CHECK(fault["likely_culprit"]["call"] == "CtxSynchronize");
}

TEST_CASE("--isolate-after-fault: the culprit's program comes back in a group of its own",
          "[e2e][isolation][culprit]") {
  Daemon daemon({"--isolate-after-fault", "600"});
  {
    Child culprit({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
    REQUIRE(culprit.wait_for_output("READY", 60s));
    CHECK(isolation_of(daemon, culprit.pid()) == "shared");
    culprit.close_stdin();
    Outcome faulted = culprit.wait(60s);
    INFO("culprit: " << faulted.out << faulted.err << "\ndaemon log:\n" << daemon.log());
    CHECK(faulted.out.find("sync=700") != std::string::npos);
  }
  // The shared server exits for a fresh one; the next e2e_client of this uid gets its own.
  REQUIRE(eventually([&] {
    const ServerLine line = server_line(daemon);
    return line.state == "running" && line.restarts == 1;
  }));
  Child again({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
  {
    INFO("again: " << again.out() << again.err() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(again.wait_for_output("READY", 60s));
  }
  CHECK(isolation_of(daemon, again.pid()) == "client:" + std::to_string(again.pid()));
  CHECK(daemon.log().find("gets an isolation group of its own: e2e_client run by uid " +
                          std::to_string(::getuid()) + " was the likely cause of a GPU fault") !=
        std::string::npos);
  // Its second fault ends only its own server.
  again.close_stdin();
  Outcome faulted = again.wait(60s);
  CHECK(faulted.out.find("sync=700") != std::string::npos);
  CHECK(eventually([&] { return group_servers(daemon).empty(); }));
  CHECK(server_line(daemon).restarts == 1);
}

TEST_CASE("an allocation registered with isolation=own gets servers of its own under a shared rule",
          "[e2e][isolation][allocation]") {
  Daemon daemon;
  Outcome registered = daemon.ctl({"register_allocation", "sm=50", "isolation=own"});
  INFO("register_allocation: " << registered.out << registered.err);
  std::smatch m;
  REQUIRE(
      std::regex_search(registered.out, m, std::regex("allocation=([0-9]+) token=([0-9a-f]+)")));
  const std::string id = m[1], token = m[2];
  const Outcome refused = daemon.ctl({"register_allocation", "isolation=private"});
  CHECK(refused.exit_code != 0);
  CHECK((refused.out + refused.err).find("isolation=private: expected own or shared") !=
        std::string::npos);

  Child pod({artefact("E2E_CLIENT"), "peek", "0"},
            daemon.client_env({{"MPSSHIM_ALLOCATION_TOKEN", token}}), true);
  Child plain({artefact("E2E_CLIENT"), "peek", "0"}, daemon.client_env(), true);
  {
    INFO("pod: " << pod.out() << pod.err() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(pod.wait_for_output("READY", 60s));
    REQUIRE(plain.wait_for_output("READY", 60s));
  }
  CHECK(isolation_of(daemon, pod.pid()) == "allocation:" + id);
  CHECK(isolation_of(daemon, plain.pid()) == "shared");
  auto groups = group_servers(daemon);
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].group == "allocation:" + id);
  // The pod's fault ends its own server only.
  pod.close_stdin();
  Outcome faulted = pod.wait(60s);
  CHECK(faulted.out.find("sync=700") != std::string::npos);
  CHECK(eventually([&] { return group_servers(daemon).empty(); }));
  CHECK(server_line(daemon).restarts == 0);
  plain.kill(SIGKILL);
}

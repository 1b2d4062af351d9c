// CUDA IPC between two clients of one server through the whole path on the CPU: ipc_client
// under LD_PRELOAD=libmpsshim.so -> mpsshimd -> mpsshim-server -> the host-memory test driver,
// with real processes (docs/ipc.md).
#include <catch2/catch.hpp>

#include <csignal>

#include <map>
#include <regex>
#include <string>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

std::string client() {
  return artefact("E2E_IPC_CLIENT");
}

std::string pool_client() {
  return artefact("E2E_POOL_IPC_CLIENT");
}

std::string field(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + "=([0-9a-f]+)"))) return "";
  return m[1];
}

// A pass with no FAIL line either (the IPC clients print one per failed check and go on).
void require_clean_pass(const Outcome& o, const Daemon& d) {
  require_pass(o, d);
  INFO("stdout: " << o.out);
  REQUIRE(o.out.find("FAIL") == std::string::npos);
}

// What the test driver holds that a departed client could leak through IPC: device memory and
// events (the server's own pools and green contexts come and go with its sessions).
struct Held {
  long long allocations, device_bytes, events;
  bool operator==(const Held&) const = default;
};
Held held(const Daemon& daemon) {
  auto objects = daemon.driver_objects();
  // The server's cuMemAlloc memory is physical VMM allocations in its arena (device_heap.hpp).
  return {objects["allocations"] + objects["physical"], objects["device_bytes"], objects["events"]};
}

// An exporter that printed its handles, and them.
struct Exporter {
  std::unique_ptr<Child> child;
  std::string base, memory, event;
};

Exporter start_exporter(const Daemon& daemon, const char* then,
                        std::map<std::string, std::string> env = {}) {
  Exporter e;
  e.child = std::make_unique<Child>(std::vector<std::string>{client(), "export", then},
                                    daemon.client_env(std::move(env)), true);
  INFO("exporter: " << e.child->out() << "\ndaemon log:\n" << daemon.log());
  REQUIRE(e.child->wait_for_output("EXPORTED", 60s));
  // Own handle refused with INVALID_CONTEXT (201), a timing event's export with INVALID_VALUE,
  // and exporting the same allocation again gives the same handle.
  REQUIRE(e.child->out().find("own_open=201 not_interprocess=1 same_handle=1") !=
          std::string::npos);
  e.base = field(e.child->out(), "base");
  e.memory = field(e.child->out(), "mem");
  e.event = field(e.child->out(), "event");
  REQUIRE(e.memory.size() == 128);
  REQUIRE(e.event.size() == 128);
  return e;
}

}  // namespace

TEST_CASE("two clients share memory and an event: each sees the other's writes, in order",
          "[e2e][ipc]") {
  Daemon daemon;
  const Held before = held(daemon);
  Exporter a = start_exporter(daemon, "keep");
  Child b({client(), "import", a.memory, a.event, "close"}, daemon.client_env(), true);
  {
    INFO("importer: " << b.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(b.wait_for_output("RECORDED", 60s));
  }
  // The open answered the exporter's own allocation base, not the exported inner pointer.
  CHECK(field(b.out(), "base") == a.base);
  // The exporter waits on the event the importer recorded behind its slow kernel and flag.
  a.child->close_stdin();
  require_clean_pass(a.child->wait(60s), daemon);
  b.close_stdin();
  require_clean_pass(b.wait(60s), daemon);
  INFO("daemon log:\n" << daemon.log());
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return held(daemon) == before; }));
}

TEST_CASE(
    "a pool exported as an fd and its allocation as export data: the importer reads and writes "
    "it, keeps it after the exporter's free, and nothing is left behind",
    "[e2e][ipc][pool_ipc]") {
  Daemon daemon;
  const Held before = held(daemon);
  Outcome o = Child({pool_client(), "export"}, daemon.client_env(), true).wait(120s);
  require_clean_pass(o, daemon);
  CHECK(o.out.find("PASS pool_ipc importer") != std::string::npos);
  CHECK(o.out.find("PASS pool_ipc exporter") != std::string::npos);
  INFO("daemon log:\n" << daemon.log());
  // The exporter freed its side first: the server kept it for the importer.
  CHECK(daemon.log().find("while other clients have it open") != std::string::npos);
  CHECK(daemon.log().find("closed the last open of allocation") != std::string::npos);
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return held(daemon) == before; }));
}

TEST_CASE(
    "the exporter frees and exits while the importer holds it; the importer still reads "
    "it, and its exit without closing leaks nothing",
    "[e2e][ipc]") {
  Daemon daemon;
  const Held before = held(daemon);
  Exporter a = start_exporter(daemon, "free");
  Child b({client(), "import", a.memory, a.event, "leave"}, daemon.client_env(), true);
  {
    INFO("importer: " << b.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(b.wait_for_output("RECORDED", 60s));
  }
  a.child->close_stdin();
  Outcome exported = a.child->wait(60s);
  require_clean_pass(exported, daemon);
  CHECK(exported.out.find("FREED") != std::string::npos);
  // The exporter is gone; its allocation is not.
  CHECK(eventually([&] { return ps_pids(daemon).size() == 1; }));
  CHECK(held(daemon).allocations == before.allocations + 1);
  CHECK(daemon.log().find("while other clients have it open") != std::string::npos);
  b.close_stdin();
  require_clean_pass(b.wait(60s), daemon);
  INFO("daemon log:\n" << daemon.log());
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return held(daemon) == before; }));
  CHECK(daemon.log().find("closed the last open of allocation") != std::string::npos);
}

TEST_CASE("memory the exporter freed while opened stays charged to it until the importer closes it",
          "[e2e][ipc]") {
  Daemon daemon;
  Exporter a = start_exporter(daemon, "watch", {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"}});
  Child b({client(), "import", a.memory, a.event, "close"}, daemon.client_env(), true);
  {
    INFO("importer: " << b.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(b.wait_for_output("RECORDED", 60s));
  }
  a.child->close_stdin();
  {
    INFO("exporter: " << a.child->out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(a.child->wait_for_output("FREED", 60s));
    CHECK(a.child->out().find("still_charged=1") != std::string::npos);
  }
  b.close_stdin();  // the importer closes it: the exporter gets its bytes back
  require_clean_pass(b.wait(60s), daemon);
  Outcome watched = a.child->wait(60s);
  require_clean_pass(watched, daemon);
  CHECK(watched.out.find("returned=1") != std::string::npos);
}

TEST_CASE(
    "a handle of GPU 0's server opened by a client on GPU 1: its kernel writes the "
    "exporter's memory, and closing lets go of it on both servers",
    "[e2e][ipc][multigpu]") {
  Daemon daemon({}, {{"MPSSHIM_TESTDRIVER_DEVICES", "2"}});
  const Held before = held(daemon);
  Exporter a = start_exporter(daemon, "keep");
  Child b({client(), "import_on", "1", a.memory, a.event}, daemon.client_env(), true);
  {
    INFO("importer: " << b.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(b.wait_for_output("RECORDED", 60s));
  }
  CHECK(field(b.out(), "base") == a.base);
  // The exporter reads what the importer's kernel on the other GPU wrote into its memory.
  a.child->close_stdin();
  require_clean_pass(a.child->wait(60s), daemon);
  b.close_stdin();
  require_clean_pass(b.wait(60s), daemon);
  INFO("daemon log:\n" << daemon.log());
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return held(daemon) == before; }));
}

TEST_CASE("forged, garbled, other GPUs' and wrong-kind handles are refused; the session lives on",
          "[e2e][ipc]") {
  Daemon daemon;
  Exporter a = start_exporter(daemon, "keep");
  Outcome forged = run_client(daemon, {client(), "forge", a.memory, a.event});
  require_clean_pass(forged, daemon);
  const std::string log = daemon.log();
  CHECK(log.find("whose secret does not match its export") != std::string::npos);
  CHECK(log.find("the client does not see GPU 1 (CUDA_VISIBLE_DEVICES)") != std::string::npos);
  // The exporter is untouched: it goes on once stdin closes (no importer recorded the event,
  // so the flag is not set and it reports FAIL: only its exit matters here).
  a.child->kill(SIGKILL);
  a.child->wait(30s);
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
}

TEST_CASE("an IPC handle does not cross isolation groups: another group's server does not hold it",
          "[e2e][ipc][isolation]") {
  Daemon daemon;
  Exporter a = start_exporter(daemon, "keep");
  // The same open from the exporter's group (the shared one) succeeds: ipc_client's other cases.
  Outcome other_group =
      run_client(daemon, {client(), "open", a.memory}, {{"MPSSHIM_ISOLATION", "own"}});
  INFO("opener: " << other_group.out << other_group.err << "\ndaemon log:\n" << daemon.log());
  CHECK(other_group.exit_code == 0);
  CHECK(other_group.out.find("OPEN result=") != std::string::npos);
  CHECK(other_group.out.find("OPEN result=0\n") == std::string::npos);
  Outcome same_group = run_client(daemon, {client(), "open", a.memory});
  CHECK(same_group.out.find("OPEN result=0\n") != std::string::npos);
  a.child->close_stdin();
  a.child->wait(60s);
}

// Suspend and resume of a running client (mpsshimctl suspend / resume, docs/suspend.md) through
// the whole path on the CPU: e2e_client under LD_PRELOAD=libmpsshim.so -> mpsshimd ->
// mpsshim-server -> the host-memory test driver, whose device memory is a fixed amount
// (MPSSHIM_TESTDRIVER_MEMORY_MB) that runs out as the GPU's does.
#include <catch2/catch.hpp>

#include <signal.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "harness.hpp"
#include "ps_json.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

constexpr long long kMiB = 1 << 20;

// 96 MiB of device memory: a client holding 48 MiB leaves no room for another's 64 MiB.
const std::map<std::string, std::string> kSmallGpu{{"MPSSHIM_TESTDRIVER_MEMORY_MB", "96"}};

std::string client() {
  return artefact("E2E_CLIENT");
}

// What mpsshimctl said: its answer on stdout, or on stderr when it failed.
std::string said(const Outcome& o) {
  return o.out + o.err;
}

long long device_bytes(const Daemon& daemon) {
  const auto objects = daemon.driver_objects();
  auto it = objects.find("device_bytes");
  return it == objects.end() ? -1 : it->second;
}

// A client holding `megabytes` of device memory and computing on another thread.
std::unique_ptr<Child> resident(const Daemon& daemon, int megabytes) {
  auto child = std::make_unique<Child>(
      std::vector<std::string>{client(), "resident", std::to_string(megabytes)},
      daemon.client_env(), true);
  REQUIRE(child->wait_for_output("READY", 60s));
  return child;
}

void finishes_with_its_bytes_intact(Child& child) {
  child.close_stdin();
  const Outcome o = child.wait(120s);
  INFO(o.out << o.err);
  CHECK(o.exit_code == 0);
  CHECK(said(o).find("PASS resident") != std::string::npos);
}

}  // namespace

TEST_CASE("a suspended client's memory leaves the GPU and comes back at its addresses",
          "[e2e][suspend]") {
  Daemon daemon({}, kSmallGpu);
  auto holder = resident(daemon, 48);
  const std::string gpu0 = "0", pid = std::to_string(holder->pid());
  const long long held = device_bytes(daemon);
  REQUIRE(held >= 48 * kMiB);

  const Outcome suspended = daemon.ctl({"suspend", gpu0, pid});
  INFO(suspended.out << suspended.err << daemon.log());
  REQUIRE(suspended.exit_code == 0);
  CHECK(suspended.out.find("suspended;") != std::string::npos);
  nlohmann::json entry = ps_entry(daemon, holder->pid());
  REQUIRE(entry.is_object());
  CHECK(entry["state"] == "suspended");
  CHECK(entry["parked_bytes"].get<long long>() >= 48 * kMiB);
  // The memory went back to the driver: another client's 64 MiB fits now.
  CHECK(device_bytes(daemon) <= held - 48 * kMiB);

  // Its thread keeps calling, and nothing of it is served while suspended: the kernels it
  // launched stay at their count over a window in which it launched thousands before.
  const long long launches = entry["launches"].get<long long>();
  std::this_thread::sleep_for(300ms);
  CHECK(ps_entry(daemon, holder->pid())["launches"].get<long long>() == launches);
  {
    Child other({client(), "hog", "64"}, daemon.client_env());
    REQUIRE(other.wait_for_output("READY", 60s));
    other.kill(SIGKILL);
    other.wait();
  }
  // The other client's memory is given back once its session is freed.
  REQUIRE(eventually([&] { return device_bytes(daemon) <= held - 48 * kMiB; }));

  const Outcome resumed = daemon.ctl({"resume", gpu0, pid});
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("resumed;") != std::string::npos);
  entry = ps_entry(daemon, holder->pid());
  CHECK(entry["state"] == "active");
  CHECK(entry["parked_bytes"] == 0);
  CHECK(entry["suspended_us"].get<long long>() >= 300'000);
  CHECK(eventually(
      [&] { return ps_entry(daemon, holder->pid())["launches"].get<long long>() > launches; }));
  // Suspended twice more mid-run: the same bytes each time.
  for (int round = 0; round < 2; ++round) {
    REQUIRE(daemon.ctl({"suspend", gpu0, pid}).exit_code == 0);
    REQUIRE(daemon.ctl({"resume", gpu0, pid}).exit_code == 0);
  }
  finishes_with_its_bytes_intact(*holder);
  CHECK(daemon.log().find("not implemented") == std::string::npos);
}

TEST_CASE("a resume the GPU has no room for fails and leaves the client suspended",
          "[e2e][suspend]") {
  Daemon daemon({}, kSmallGpu);
  auto holder = resident(daemon, 48);
  const std::string gpu0 = "0", pid = std::to_string(holder->pid());
  REQUIRE(daemon.ctl({"suspend", gpu0, pid}).exit_code == 0);
  auto other =
      std::make_unique<Child>(std::vector<std::string>{client(), "hog", "64"}, daemon.client_env());
  REQUIRE(other->wait_for_output("READY", 60s));

  const Outcome refused = daemon.ctl({"resume", gpu0, pid});
  INFO(refused.out << refused.err);
  CHECK(refused.exit_code != 0);
  CHECK(said(refused).find("stays suspended") != std::string::npos);
  CHECK(said(refused).find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(ps_entry(daemon, holder->pid())["state"] == "suspended");

  other->kill(SIGKILL);
  other->wait();
  // Room again once the other client's memory is freed.
  CHECK(eventually([&] { return daemon.ctl({"resume", gpu0, pid}).exit_code == 0; }));
  finishes_with_its_bytes_intact(*holder);
}

TEST_CASE("a client killed while suspended leaves nothing behind", "[e2e][suspend]") {
  Daemon daemon({"--context-idle-timeout", "-1"}, kSmallGpu);
  const long long before = device_bytes(daemon);
  auto holder = resident(daemon, 32);
  REQUIRE(daemon.ctl({"suspend", "0", std::to_string(holder->pid())}).exit_code == 0);
  holder->kill(SIGKILL);
  holder->wait();
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return device_bytes(daemon) == before; }));
  // The server is whole: a new client gets all of the memory.
  auto next = resident(daemon, 80);
  finishes_with_its_bytes_intact(*next);
}

TEST_CASE("suspend and resume refuse what they cannot do, and change nothing", "[e2e][suspend]") {
  Daemon daemon({}, kSmallGpu);
  auto holder = resident(daemon, 8);
  const std::string gpu0 = "0", pid = std::to_string(holder->pid());

  Outcome o = daemon.ctl({"resume", gpu0, pid});
  CHECK(o.exit_code != 0);
  CHECK(said(o).find("is not suspended") != std::string::npos);
  REQUIRE(daemon.ctl({"suspend", gpu0, pid}).exit_code == 0);
  o = daemon.ctl({"suspend", gpu0, pid});
  CHECK(o.exit_code != 0);
  CHECK(said(o).find("suspended already") != std::string::npos);
  o = daemon.ctl({"suspend", gpu0, "999999"});
  CHECK(o.exit_code != 0);
  CHECK(said(o).find("no client with pid 999999") != std::string::npos);
  o = daemon.ctl({"suspend", gpu0, "nobody"});
  CHECK(o.exit_code != 0);
  REQUIRE(daemon.ctl({"resume", gpu0, pid}).exit_code == 0);

  // Memory another process may map through an IPC handle cannot be parked.
  Child exporter({artefact("E2E_IPC_CLIENT"), "export", "free"}, daemon.client_env(), true);
  REQUIRE(exporter.wait_for_output("EXPORTED", 60s));
  o = daemon.ctl({"suspend", gpu0, std::to_string(exporter.pid())});
  INFO(o.out << o.err);
  CHECK(o.exit_code != 0);
  CHECK(said(o).find("cannot be suspended: it exported memory with cuIpcGetMemHandle") !=
        std::string::npos);
  CHECK(ps_entry(daemon, exporter.pid())["state"] == "active");
  exporter.kill(SIGKILL);
  exporter.wait();
  finishes_with_its_bytes_intact(*holder);
}

TEST_CASE(
    "--park-pool: suspends park in the pool, kept for the next, and beyond it in fresh memory",
    "[e2e][suspend]") {
  // 64 MiB hold the whole client (about 52 MiB parked) once, not twice: three rounds all in the
  // pool show that each resume gave its ranges back. 16 MiB hold only part of it.
  for (const long long pool_mib : {64LL, 16LL}) {
    INFO("pool of " << pool_mib << " MiB");
    Daemon daemon({"--park-pool", std::to_string(pool_mib * kMiB)}, kSmallGpu);
    auto holder = resident(daemon, 48);
    const std::string ready = "park pool: " + std::to_string(pool_mib) + " MiB of page-locked";
    REQUIRE(eventually([&] { return daemon.log().find(ready) != std::string::npos; }));
    const std::string pid = std::to_string(holder->pid());
    for (int round = 0; round < 3; ++round) {
      const Outcome suspended = daemon.ctl({"suspend", "0", pid});
      INFO(said(suspended));
      REQUIRE(suspended.exit_code == 0);
      const nlohmann::json entry = ps_entry(daemon, holder->pid());
      REQUIRE(entry.is_object());
      const long long parked = entry["parked_bytes"].get<long long>();
      REQUIRE(parked >= 48 * kMiB);
      REQUIRE(parked < 2 * 32 * kMiB);  // what the first case's sizes assume
      // "(N MiB of it in the park pool)": all of it, or only what the pool has room for.
      const std::size_t at = suspended.out.find(" of it in the park pool");
      REQUIRE(at != std::string::npos);
      const std::size_t open = suspended.out.rfind('(', at);
      const long long pooled_mib = std::stoll(suspended.out.substr(open + 1));
      if (pool_mib * kMiB >= parked) {
        CHECK(pooled_mib * kMiB == parked);
      } else {
        CHECK(pooled_mib * kMiB < parked);
      }
      REQUIRE(daemon.ctl({"resume", "0", pid}).exit_code == 0);
    }
    finishes_with_its_bytes_intact(*holder);
    // Prepared once: the context was held throughout.
    const std::string log = daemon.log();
    CHECK(log.find(ready) == log.rfind(ready));
  }
}

namespace {

constexpr int kMixedRounds = 1200;

std::unique_ptr<Child> mixed(const Daemon& daemon) {
  auto child =
      std::make_unique<Child>(std::vector<std::string>{artefact("E2E_SUSPEND_CLIENT"), "mixed",
                                                       std::to_string(kMixedRounds)},
                              daemon.client_env(), true);
  REQUIRE(child->wait_for_output("READY", 60s));
  return child;
}

// The client's "RESULT <hex>" once it passed, or empty.
std::string result_of(Child& child) {
  child.close_stdin();
  const Outcome o = child.wait(120s);
  INFO(o.out << o.err);
  CHECK(o.exit_code == 0);
  CHECK(said(o).find("PASS mixed") != std::string::npos);
  const std::size_t at = o.out.find("RESULT ");
  return at == std::string::npos ? std::string() : o.out.substr(at + 7, 16);
}

// Its cuMemAlloc (16 MiB), pool (4 MiB) and VMM (4 granules of 2 MiB) memory.
constexpr long long kMixedHeld = (16 + 4 + 8) * kMiB;

}  // namespace

TEST_CASE(
    "a client with memory, a pool, a module, streams, events, a graph and VMM mappings is "
    "suspended and resumed mid-run and ends as an uninterrupted run",
    "[e2e][suspend]") {
  Daemon daemon({"--context-idle-timeout", "-1"});
  const long long idle = device_bytes(daemon);
  std::string uninterrupted;
  {
    auto run = mixed(daemon);
    uninterrupted = result_of(*run);
    REQUIRE(uninterrupted.size() == 16);
  }
  REQUIRE(eventually([&] { return device_bytes(daemon) == idle; }));
  auto run = mixed(daemon);
  const std::string pid = std::to_string(run->pid());
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    const long long held = device_bytes(daemon);
    const Outcome suspended = daemon.ctl({"suspend", "0", pid});
    INFO(said(suspended) << daemon.log());
    REQUIRE(suspended.exit_code == 0);
    const nlohmann::json entry = ps_entry(daemon, run->pid());
    REQUIRE(entry.is_object());
    CHECK(entry["state"] == "suspended");
    // Its physical allocations were parked with the rest, and left the device with it.
    CHECK(entry["parked_bytes"].get<long long>() >= kMixedHeld);
    CHECK(device_bytes(daemon) <= held - kMixedHeld);
    const long long launches = entry["launches"].get<long long>();
    std::this_thread::sleep_for(100ms);
    CHECK(ps_entry(daemon, run->pid())["launches"].get<long long>() == launches);
    const Outcome resumed = daemon.ctl({"resume", "0", pid});
    INFO(said(resumed));
    REQUIRE(resumed.exit_code == 0);
    // Resumed mid-run: its threads go on launching.
    if (round == 0) {
      CHECK(eventually(
          [&] { return ps_entry(daemon, run->pid())["launches"].get<long long>() > launches; }));
    }
  }
  CHECK(result_of(*run) == uninterrupted);
  CHECK(eventually([&] { return device_bytes(daemon) == idle; }));
}

TEST_CASE(
    "a resume with no room for the cuMemAlloc memory takes the VMM memory it put back off the "
    "GPU again",
    "[e2e][suspend]") {
  Daemon daemon({}, kSmallGpu);
  auto run = mixed(daemon);
  const std::string pid = std::to_string(run->pid());
  REQUIRE(daemon.ctl({"suspend", "0", pid}).exit_code == 0);
  // 72 MiB taken: the 8 MiB of VMM memory fit back, the 20 MiB of cuMemAlloc memory do not.
  auto other =
      std::make_unique<Child>(std::vector<std::string>{client(), "hog", "72"}, daemon.client_env());
  REQUIRE(other->wait_for_output("READY", 60s));
  const long long with_other = device_bytes(daemon);
  const Outcome refused = daemon.ctl({"resume", "0", pid});
  INFO(said(refused) << daemon.log());
  CHECK(refused.exit_code != 0);
  CHECK(said(refused).find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(said(refused).find("of cuMemCreate memory, put back first, was taken off again") !=
        std::string::npos);
  CHECK(ps_entry(daemon, run->pid())["state"] == "suspended");
  CHECK(device_bytes(daemon) == with_other);
  other->kill(SIGKILL);
  other->wait();
  CHECK(eventually([&] { return daemon.ctl({"resume", "0", pid}).exit_code == 0; }));
  CHECK(result_of(*run).size() == 16);
}

TEST_CASE("a client killed while its VMM memory is parked leaves nothing behind",
          "[e2e][suspend]") {
  Daemon daemon({"--context-idle-timeout", "-1"});
  const auto before = daemon.driver_objects();
  REQUIRE(before.count("physical") == 1);
  auto run = mixed(daemon);
  REQUIRE(daemon.ctl({"suspend", "0", std::to_string(run->pid())}).exit_code == 0);
  // All of its physical allocations released, the heap's blocks and its own A and B alike.
  CHECK(daemon.driver_objects()["physical"] == before.at("physical"));
  run->kill(SIGKILL);
  run->wait();
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return device_bytes(daemon) == before.at("device_bytes"); }));
  const auto after = daemon.driver_objects();
  CHECK(after.at("physical") == before.at("physical"));
  CHECK(after.at("vmm") == before.at("vmm"));
  INFO(daemon.log());
  // Nothing parked was unmapped or released as if it were on the device.
  CHECK(daemon.log().find("failed while freeing") == std::string::npos);
}

TEST_CASE("a physical allocation handed to another process as an fd is not suspended",
          "[e2e][suspend]") {
  Daemon daemon;
  const std::string socket_path = daemon.dir() + "/share";
  Child owner({artefact("E2E_VMM_CLIENT"), "share-owner", socket_path}, daemon.client_env());
  REQUIRE(owner.wait_for_output("READY", 60s));
  const Outcome o = daemon.ctl({"suspend", "0", std::to_string(owner.pid())});
  INFO(said(o));
  CHECK(o.exit_code != 0);
  CHECK(said(o).find("cannot be suspended: it handed a physical allocation of its own") !=
        std::string::npos);
  CHECK(ps_entry(daemon, owner.pid())["state"] == "active");
  owner.kill(SIGKILL);
  owner.wait();
}

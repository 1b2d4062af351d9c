// The crash storm: 8 well-behaved clients work through the daemon on the test driver while other
// clients are SIGKILLed, each at a point where its death leaves the server the most to clean up
// (mid-launch, mid-copy, mid-allocation, during a host function, during a graph launch, while
// holding pinned memory, or while it attaches). Afterwards the busy clients pass (every element
// checked), the server is the same process, never restarted, and its open fds, resident memory
// and the test driver's live objects are back to their baseline.
//
// MPSSHIM_STORM_KILLS=N (default 100; 1000 for the full run in docs/testing.md) sets the number
// of kills; MPSSHIM_STORM_SEED=S replays a failed run's phases and delays (printed on failure).
#include <signal.h>
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "harness.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

constexpr int kBusyClients = 8;
constexpr int kWave = 4;  // victims alive at once
// Resident memory the server may keep after the storm, over what it had with the busy clients
// alone before it: what glibc's allocator keeps of freed session state (arenas, free lists) is
// not returned to the kernel. A leak of what one victim session holds (its segment mappings
// alone are several MiB) times a thousand kills is far beyond it.
constexpr long long kRssToleranceKib = 32 << 10;
// Under ASan the server's freed memory waits in the sanitizer's quarantine (up to 256 MiB), and
// under TSan its shadow grows with every address touched: resident memory then says nothing about
// leaks, which ASan's leak checker reports instead. The figures are printed either way.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCheckRss = false;
#else
constexpr bool kCheckRss = true;
#endif
// The phases storm_victim announces; a victim killed before its announcement counts as "attach".
constexpr std::array<const char*, 6> kPhases = {"launch", "copy",  "alloc",
                                                "hostfn", "graph", "pinned"};
// The kinds of driver objects the busy clients hold steadily while they work (their allocations
// and the server's completion events for their synchronizations come and go).
constexpr std::array<const char*, 9> kSteadyKinds = {"streams",       "modules", "libraries",
                                                     "registrations", "graphs",  "graph_execs",
                                                     "arrays",        "pools",   "vmm"};
// Green contexts are apart: while the busy clients keep the primary context, the server keeps
// the victims' green contexts for later clients, at most its pool's capacity
// (kDefaultGreenContextPoolCapacity, broker/server/scheduling/green_context_pool.hpp). A leak of
// one per victim goes far beyond it; at rest the pool is emptied and the count must be back to 0.
constexpr long long kPooledGreenContexts = 32;

std::map<std::string, long long> steady_kinds(const std::map<std::string, long long>& objects) {
  std::map<std::string, long long> steady;
  for (const char* kind : kSteadyKinds) {
    auto it = objects.find(kind);
    steady[kind] = it == objects.end() ? -1 : it->second;
  }
  return steady;
}

std::string describe(const std::map<std::string, long long>& counts) {
  std::string text;
  for (const auto& [kind, n] : counts) text += kind + "=" + std::to_string(n) + " ";
  return text;
}

}  // namespace

TEST_CASE("a storm of clients killed mid-work leaves the server and the busy clients unharmed",
          "[e2e][storm]") {
  // The primary context (and with it every pooled green context) goes as soon as the last
  // client has: the end of the test compares the driver's objects at rest.
  Daemon daemon({"--server-workers", "4", "--context-idle-timeout", "0"});
  const ServerLine server = server_line(daemon);
  REQUIRE(server.pid > 0);
  REQUIRE(server.state == "running");
  REQUIRE(server.restarts == 0);
  std::map<std::string, long long> objects_idle;
  REQUIRE(eventually([&] { return !(objects_idle = daemon.driver_objects()).empty(); }, 10s));
  const int fds_idle = open_fd_count(server.pid);
  const long long rss_idle = resident_kib(server.pid);
  REQUIRE(fds_idle > 0);

  std::vector<std::unique_ptr<Child>> busy;
  std::set<int> busy_pids;
  for (int i = 0; i < kBusyClients; ++i) {
    busy.push_back(
        std::make_unique<Child>(std::vector<std::string>{artefact("E2E_CLIENT"), "stress", "0"},
                                daemon.client_env(), true));
    busy_pids.insert(busy.back()->pid());
  }
  for (auto& c : busy) {
    INFO("stdout: " << c->out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(c->wait_for_output("READY", 120s));
  }
  REQUIRE(eventually([&] { return ps_pids(daemon) == busy_pids; }));
  std::this_thread::sleep_for(500ms);  // the server's allocator reaches its working size
  const int fds_busy = open_fd_count(server.pid);
  const long long rss_busy = resident_kib(server.pid);
  const std::map<std::string, long long> objects_busy = daemon.driver_objects();
  const auto steady_busy = steady_kinds(objects_busy);

  const int kills = env_int("MPSSHIM_STORM_KILLS", 100);
  const unsigned seed = static_cast<unsigned>(
      env_int("MPSSHIM_STORM_SEED", static_cast<int>(std::random_device{}() % 1000000)));
  INFO("MPSSHIM_STORM_SEED=" << seed);
  std::mt19937 random(seed);
  std::map<std::string, int> killed_in;  // phase -> kills
  int killed = 0;
  const auto storm_start = std::chrono::steady_clock::now();
  while (killed < kills) {
    struct Victim {
      std::string phase;
      std::unique_ptr<Child> child;
    };
    std::vector<Victim> wave;
    for (int i = 0; i < kWave; ++i) {
      const std::string phase = kPhases[random() % kPhases.size()];
      wave.push_back(
          {phase, std::make_unique<Child>(std::vector<std::string>{artefact("STORM_VICTIM"), phase},
                                          daemon.client_env())});
    }
    for (auto& [phase, child] : wave) {
      // One in five dies while it attaches and prepares (at most 30 ms after its start, before
      // its announcement); the rest a random time (up to 20 ms) into their phase's work.
      if (random() % 5 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 30000));
        child->wait_for_output("PHASE", 0s);  // reads what it printed so far
        ++killed_in[child->out().find("PHASE") == std::string::npos ? "attach" : phase];
      } else {
        if (!child->wait_for_output("PHASE " + phase, 60s)) {
          Outcome o = child->wait(1s);
          INFO("victim (" << phase << ", pid " << child->pid() << ") did not announce its phase;"
                          << " stdout: " << o.out << "\nstderr: " << o.err << "\nps:\n"
                          << daemon.ctl({"ps"}).out << "\ndaemon log:\n"
                          << daemon.log());
          FAIL();
        }
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 20000));
        ++killed_in[phase];
      }
      child->kill(SIGKILL);
    }
    for (auto& [phase, child] : wave) {
      Outcome o = child->wait(30s);
      INFO("victim (" << phase << ") stdout: " << o.out << "\nstderr: " << o.err);
      CHECK(o.exit_code == -SIGKILL);  // none failed or ended before its kill
      ++killed;
    }
  }
  const double storm_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - storm_start).count();
  for (const char* phase : kPhases) CHECK(killed_in[phase] > 0);

  // The same server, never restarted, serving only the busy clients; every victim's fds, memory
  // and driver objects are gone.
  const ServerLine after = server_line(daemon);
  CHECK(after.pid == server.pid);
  CHECK(after.state == "running");
  CHECK(after.restarts == 0);
  {
    INFO("ps:\n" << daemon.ctl({"ps"}).out);
    CHECK(eventually([&] { return ps_pids(daemon) == busy_pids; }));
  }
  {
    const bool closed = eventually([&] { return open_fd_count(server.pid) == fds_busy; });
    INFO("server fds: " << open_fd_count(server.pid) << ", " << fds_busy << " before the storm");
    CHECK(closed);
  }
  {
    std::map<std::string, long long> steady_after;
    const bool back = eventually(
        [&] { return (steady_after = steady_kinds(daemon.driver_objects())) == steady_busy; });
    INFO("driver objects after the storm: " << describe(steady_after)
                                            << "\nbefore: " << describe(steady_busy));
    CHECK(back);
    const long long green_after = daemon.driver_objects()["green_contexts"];
    INFO("green contexts: " << green_after << " after the storm, "
                            << objects_busy.at("green_contexts") << " with the busy clients");
    CHECK(green_after >= objects_busy.at("green_contexts"));
    CHECK(green_after <= objects_busy.at("green_contexts") + kPooledGreenContexts);
  }
  const int fds_after_storm = open_fd_count(server.pid);
  const long long rss_after_storm = resident_kib(server.pid);
  if (kCheckRss) CHECK(rss_after_storm <= rss_busy + kRssToleranceKib);

  for (auto& c : busy) c->close_stdin();
  for (auto& c : busy) {
    Outcome o = c->wait(120s);
    INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
    CHECK(o.exit_code == 0);
    CHECK(o.out.find("PASS stress") != std::string::npos);
  }
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  {
    const bool closed = eventually([&] { return open_fd_count(server.pid) == fds_idle; });
    INFO("server fds: " << open_fd_count(server.pid) << ", " << fds_idle << " without clients");
    CHECK(closed);
  }
  std::map<std::string, long long> objects_end;
  {
    const bool back =
        eventually([&] { return (objects_end = daemon.driver_objects()) == objects_idle; });
    INFO("driver objects at the end: " << describe(objects_end)
                                       << "\nbefore any client: " << describe(objects_idle));
    CHECK(back);
  }
  const long long rss_end = resident_kib(server.pid);
  CHECK(server_line(daemon).pid == server.pid);
  CHECK(server_line(daemon).restarts == 0);
  const std::string log = daemon.log();
  CHECK(log.find("GPU fault") == std::string::npos);
  CHECK(log.find("restarting") == std::string::npos);
  // At rest: the pool emptied before the primary context went (objects_end holds no green
  // context either).
  CHECK(log.find("released the primary context (no client for the idle timeout) and") !=
        std::string::npos);

  // The figures docs/testing.md quotes.
  std::string phases;
  for (const auto& [phase, n] : killed_in) phases += " " + phase + "=" + std::to_string(n);
  std::printf(
      "storm: kills=%d (%s ) seconds=%.1f seed=%u\n"
      "storm: server rss_kib idle=%lld busy=%lld after_storm=%lld end=%lld\n"
      "storm: server fds idle=%d busy=%d after_storm=%d end=%d\n"
      "storm: driver objects idle: %s\nstorm: driver objects end:  %s\n",
      killed, phases.c_str(), storm_seconds, seed, rss_idle, rss_busy, rss_after_storm, rss_end,
      fds_idle, fds_busy, fds_after_storm, open_fd_count(server.pid),
      describe(objects_idle).c_str(), describe(objects_end).c_str());
}

// cuMemFree synchronizes the device (the real driver's and the test driver's), so while a client's
// host function runs, every other client's free waits for it, as natively. When that client dies
// inside its callback, the waiting free must go on: the host function sees the hang-up itself.
// Before it did, it waited for the worker to end the session while the worker waited in
// cuMemFree for the host function: the whole server hung (found by the storm above).
TEST_CASE("a client killed inside a host function does not hold up another client's free",
          "[e2e][storm]") {
  Daemon daemon({"--server-workers", "1"});  // both sessions on one worker
  Child stalled({artefact("STORM_VICTIM"), "stall"}, daemon.client_env());
  {
    INFO("stdout: " << stalled.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(stalled.wait_for_output("PHASE stall", 60s));
  }
  // Its frees reach the driver (the server frees after a fence, so the client may already have
  // its answers) and wait there for the stalled host function, like a native process's would.
  Child other({artefact("E2E_CLIENT"), "basic", "4096"}, daemon.client_env());
  other.wait_for_output("PASS", 1s);
  stalled.kill(SIGKILL);
  CHECK(stalled.wait(30s).exit_code == -SIGKILL);
  for (Outcome o :
       {other.wait(30s), run_client(daemon, {artefact("E2E_CLIENT"), "basic", "4096"})}) {
    INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
    CHECK(o.exit_code == 0);
    CHECK(o.out.find("PASS basic") != std::string::npos);
  }
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
}

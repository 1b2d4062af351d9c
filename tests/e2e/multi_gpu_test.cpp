// Two GPUs on the CPU: the daemon over a two-device test driver starts a server per
// GPU; one client uses both through two sessions, and a fault on GPU 0 stays on GPU 0: its
// server restarts, GPU 1's server and clients never notice, and the faulting client's GPU 1
// work goes on.
#include <signal.h>

#include <catch2/catch.hpp>

#include <map>
#include <sstream>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

std::string client() {
  return artefact("E2E_CLIENT");
}

const std::map<std::string, std::string> kTwoDevices{{"MPSSHIM_TESTDRIVER_DEVICES", "2"}};

}  // namespace

TEST_CASE("one client uses two GPUs through their two servers", "[e2e][multigpu]") {
  Daemon daemon({}, kTwoDevices);
  require_pass(run_client(daemon, {client(), "two_gpus"}), daemon);
  const auto list = server_lines(daemon);
  REQUIRE(list.size() == 2);
  CHECK(list.at(0).pid != list.at(1).pid);
  // One GPU each, as CUDA_VISIBLE_DEVICES picks it.
  require_pass(run_client(daemon, {client(), "basic", "4099"}, {{"CUDA_VISIBLE_DEVICES", "1"}}),
               daemon);
}

TEST_CASE("a fault on GPU 0 stays on GPU 0", "[e2e][multigpu]") {
  Daemon daemon({}, kTwoDevices);
  // A client of GPU 1 alone, attached across the fault.
  Child bystander({client(), "pointer"}, daemon.client_env({{"CUDA_VISIBLE_DEVICES", "1"}}));
  {
    const bool attached = bystander.wait_for_output("POINTER", 60s);
    INFO("bystander stdout: " << bystander.out() << "\nstderr: " << bystander.err()
                              << "\ndaemon log:\n"
                              << daemon.log());
    REQUIRE(attached);
  }
  const auto before = server_lines(daemon);
  REQUIRE(before.size() == 2);

  require_pass(run_client(daemon, {client(), "two_gpus_fault"}), daemon);

  INFO("daemon log:\n" << daemon.log());
  REQUIRE(eventually([&] { return server_lines(daemon)[0].restarts == before.at(0).restarts + 1; },
                     30s));
  const auto after = server_lines(daemon);
  CHECK(after.at(1).pid == before.at(1).pid);
  CHECK(after.at(1).restarts == before.at(1).restarts);
  // The bystander is still attached to GPU 1's server, and GPU 0 serves new clients again.
  CHECK(ps_pids(daemon).count(bystander.pid()) == 1);
  require_pass(run_client(daemon, {client(), "basic", "1000"}, {{"CUDA_VISIBLE_DEVICES", "0"}}),
               daemon);
  bystander.kill(SIGKILL);
}

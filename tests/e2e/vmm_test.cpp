// Virtual memory management through the whole path on the CPU: vmm_client under
// LD_PRELOAD=libmpsshim.so -> mpsshimd -> mpsshim-server -> the host-memory test driver, with
// real processes (docs/vmm.md).
#include <signal.h>
#include <catch2/catch.hpp>

#include <regex>
#include <string>
#include <thread>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

std::string client() {
  return artefact("E2E_VMM_CLIENT");
}
std::string sparse_array_client() {
  return artefact("E2E_SPARSE_ARRAY_CLIENT");
}
std::string e2e_client() {
  return artefact("E2E_CLIENT");
}

unsigned long long field(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + "=([0-9]+)"))) return ~0ull;
  return std::stoull(m[1]);
}

// Free device memory as a fresh client sees it (e2e_client meminfo).
unsigned long long free_memory(const Daemon& daemon) {
  Outcome o = run_client(daemon, {e2e_client(), "meminfo"});
  require_pass(o, daemon);
  return field(o.out, "free");
}

// Polls until a fresh client sees `expected` free bytes again (the server frees a departed
// client's memory once its session drained); the last value seen.
unsigned long long await_free(const Daemon& daemon, unsigned long long expected) {
  unsigned long long seen = 0;
  for (int attempt = 0; attempt < 150; ++attempt) {
    seen = free_memory(daemon);
    if (seen == expected) break;
    std::this_thread::sleep_for(100ms);
  }
  return seen;
}

constexpr unsigned long long kHeldMiB = 64;

}  // namespace

TEST_CASE("reserve, create, map, set access, write, read back, unmap, release", "[e2e][vmm]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "lifecycle"}), daemon);
}

TEST_CASE(
    "an expandable allocator grows a reservation chunk by chunk; copies and kernels cross "
    "the chunks",
    "[e2e][vmm]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "grow", "5"}), daemon);
  require_pass(run_client(daemon, {client(), "grow", "9"}), daemon);
}

TEST_CASE("tiles of a sparse array mapped onto a tile pool hold what is written; bad maps refused",
          "[e2e][vmm][sparse]") {
  Daemon daemon;
  require_pass(run_client(daemon, {sparse_array_client(), "map"}), daemon);
}

TEST_CASE("a sparse array costs nothing; a tile pool its tiles mapped is charged until it goes",
          "[e2e][vmm][sparse]") {
  Daemon daemon;
  require_pass(run_client(daemon, {sparse_array_client(), "limit"},
                          {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4M"}}),
               daemon);
}

TEST_CASE("a client that exits with tiles mapped onto a released tile pool leaves nothing held",
          "[e2e][vmm][sparse]") {
  Daemon daemon;
  const unsigned long long before = free_memory(daemon);
  require_pass(run_client(daemon, {sparse_array_client(), "exit-mapped"}), daemon);
  CHECK(await_free(daemon, before) == before);
}

TEST_CASE("cuMemCreate over the client's memory limit is refused with a message naming it",
          "[e2e][vmm]") {
  Daemon daemon;
  Outcome o = run_client(daemon, {client(), "limit", "64"},
                         {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"}});
  require_pass(o, daemon);
  CHECK(field(o.out, "total") == (64ull << 20));
  const std::string log = daemon.log();
  INFO("daemon log:\n" << log);
  CHECK(log.find("device memory (cuMemCreate)") != std::string::npos);
  CHECK(log.find("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != std::string::npos);
}

TEST_CASE("a client killed or exiting with live mappings leaves nothing on the server",
          "[e2e][vmm]") {
  Daemon daemon;
  const unsigned long long free_before = free_memory(daemon);

  SECTION("killed with SIGKILL") {
    Child holder({client(), "hold", std::to_string(kHeldMiB)}, daemon.client_env());
    REQUIRE(holder.wait_for_output("READY", 60s));
    CHECK(field(holder.out(), "free") + (kHeldMiB << 20) <= free_before);
    CHECK(daemon.ctl({"ps"}).out.find(std::to_string(holder.pid())) != std::string::npos);
    holder.kill(SIGKILL);
    CHECK(holder.wait(30s).exit_code == -SIGKILL);
  }
  SECTION("exiting without unmapping or releasing") {
    Child holder({client(), "hold-exit", std::to_string(kHeldMiB)}, daemon.client_env());
    REQUIRE(holder.wait_for_output("READY", 60s));
    CHECK(holder.wait(30s).exit_code == 0);
  }

  CHECK(await_free(daemon, free_before) == free_before);
  // The session-end line names what was freed: the mapping, the allocation, the reservation.
  // It is written just after the memory went back, so it may trail the check above.
  const std::regex freed("1 physical allocation \\(64 MiB\\), 1 mapping, 1 address reservation");
  std::string log;
  for (int attempt = 0; attempt < 150; ++attempt) {
    log = daemon.log();
    if (std::regex_search(log, freed)) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO("daemon log:\n" << log);
  CHECK(std::regex_search(log, freed));
  CHECK(log.find("failed while freeing") == std::string::npos);
}

TEST_CASE("a client cannot use another client's handle or mapping, nor export it", "[e2e][vmm]") {
  Daemon daemon;
  Child owner({client(), "hold", "4"}, daemon.client_env());
  REQUIRE(owner.wait_for_output("READY", 60s));
  const std::string handle = std::to_string(field(owner.out(), "handle"));
  const std::string address = std::to_string(field(owner.out(), "address"));
  Outcome thief = run_client(daemon, {client(), "steal", handle, address});
  require_pass(thief, daemon);
  // The owner's memory is untouched and the server still serves everyone.
  require_pass(run_client(daemon, {client(), "lifecycle"}), daemon);
  owner.kill(SIGKILL);
}

TEST_CASE(
    "two processes on two GPUs share VMM memory as NCCL does: export, fd over a socket, import, "
    "map, set access, write from the other GPU",
    "[e2e][vmm][multigpu]") {
  Daemon daemon({}, {{"MPSSHIM_TESTDRIVER_DEVICES", "2"}});
  const std::string path = daemon.dir() + "/share.sock";
  Child owner({client(), "share-owner", path}, daemon.client_env({{"CUDA_VISIBLE_DEVICES", "0"}}));
  {
    INFO("owner: " << owner.out() << owner.err() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(owner.wait_for_output("READY", 60s));
  }
  require_pass(run_client(daemon, {client(), "share-peer", path}, {{"CUDA_VISIBLE_DEVICES", "1"}}),
               daemon);
  require_pass(owner.wait(60s), daemon);
}

TEST_CASE("VMM memory of one GPU given to the other with cuMemSetAccess: the other GPU writes it",
          "[e2e][vmm][multigpu]") {
  Daemon daemon({}, {{"MPSSHIM_TESTDRIVER_DEVICES", "2"}});
  require_pass(run_client(daemon, {client(), "peer-access"}), daemon);
  require_pass(run_client(daemon, {client(), "cross-map"}), daemon);
}

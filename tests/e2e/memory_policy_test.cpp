// The memory policies (--memory-preemption, --memory-overcommit; docs/suspend.md) through the
// whole path on the CPU: e2e_client under LD_PRELOAD=libmpsshim.so -> mpsshimd ->
// mpsshim-server -> the host-memory test driver, whose 96 MiB of device memory run out as a
// GPU's does (MPSSHIM_TESTDRIVER_MEMORY_MB).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "harness.hpp"
#include "ps_json.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

constexpr long long kMiB = 1 << 20;
const std::map<std::string, std::string> kSmallGpu{{"MPSSHIM_TESTDRIVER_MEMORY_MB", "96"}};

std::string client() {
  return artefact("E2E_CLIENT");
}

// An e2e_client `holder MB` (one cuMemAlloc, then idle until its stdin closes), or with `mode`
// `pitch_holder` one cuMemAllocPitch, started.
std::unique_ptr<Child> holder(int megabytes, std::map<std::string, std::string> env,
                              const std::string& mode = "holder") {
  return std::make_unique<Child>(
      std::vector<std::string>{client(), mode, std::to_string(megabytes)}, env, true);
}

// Its stdin closed: it checks its bytes and ends with the line `pass` (e2e_client holder's by
// default; not "PASS holder, nothing held").
void ends_with_its_bytes_intact(Child& child, const std::string& pass = "PASS holder") {
  child.close_stdin();
  const Outcome o = child.wait(120s);
  INFO(o.out << o.err);
  CHECK(o.exit_code == 0);
  CHECK(o.out.find(pass + "\n") != std::string::npos);
}

// `normal`, a normal-priority client started beside `idle`, an idle below-normal one holding 48
// of the GPU's 96 MiB, needs 64: its allocation suspends `idle`, which parks its bytes; once
// `normal` has ended, `idle` is resumed by itself. Each ends with its line (`*_pass`).
void makes_room_and_gets_it_back(Daemon& daemon, Child& idle, const std::string& idle_pass,
                                 std::unique_ptr<Child> normal, const std::string& normal_pass) {
  {
    REQUIRE(normal->wait_for_output("READY", 60s));
    INFO(normal->out() << daemon.log());
    const nlohmann::json entry = ps_entry(daemon, idle.pid());
    REQUIRE(entry.is_object());
    CHECK(entry["state"] == "preempted");
    CHECK(entry["parked_bytes"].get<long long>() >= 48 * kMiB);
    CHECK(state_of(daemon, normal->pid()) == "active");
    ends_with_its_bytes_intact(*normal, normal_pass);
  }
  CHECK(eventually([&] { return state_of(daemon, idle.pid()) == "active"; }));
  CHECK(daemon.log().find("was resumed: the GPU has room for it again") != std::string::npos);
  ends_with_its_bytes_intact(idle, idle_pass);
}

}  // namespace

TEST_CASE(
    "--memory-preemption: an idle below-normal client makes room for a normal one and "
    "comes back when the memory frees",
    "[e2e][suspend][policy]") {
  Daemon daemon({"--memory-preemption", "on", "--preemption-idle-ms", "0"}, kSmallGpu);
  auto idle = holder(48, daemon.client_env({{"CUDA_MPS_CLIENT_PRIORITY", "1"}}));
  REQUIRE(idle->wait_for_output("READY", 60s));
  REQUIRE(idle->out().find("ALLOC 0\n") != std::string::npos);
  {
    // More than the GPU has: it fails at once, and no one is suspended for it.
    const Outcome huge = run_client(daemon, {client(), "holder", "100"});
    INFO(huge.out << huge.err);
    CHECK(huge.out.find("ALLOC 2\n") != std::string::npos);
    CHECK(state_of(daemon, idle->pid()) == "active");
  }
  // 64 MiB do not fit beside the 48: the allocation suspends the idle client, which is resumed
  // once the normal client's session has freed its memory. The idle client's physical memory
  // goes to the allocation, cleared: 48 MiB of it, and 16 MiB new (device_heap.hpp).
  auto normal = holder(64, daemon.client_env());
  REQUIRE(normal->wait_for_output("READY", 60s));
  {
    INFO(normal->out() << daemon.log());
    CHECK(normal->out().find("ALLOC 0\nFRESH zero\n") != std::string::npos);
    CHECK(daemon.log().find("64 MiB at 0x") != std::string::npos);
    CHECK(
        daemon.log().find("made of 48 MiB of memory taken from preempted clients and 16 MiB new") !=
        std::string::npos);
  }
  makes_room_and_gets_it_back(daemon, *idle, "PASS holder", std::move(normal), "PASS holder");
}

TEST_CASE(
    "--memory-preemption: memory handed over by a preempted client is reached from another GPU",
    "[e2e][suspend][policy][multigpu]") {
  Daemon daemon({"--memory-preemption", "on", "--preemption-idle-ms", "0"},
                {{"MPSSHIM_TESTDRIVER_MEMORY_MB", "96"}, {"MPSSHIM_TESTDRIVER_DEVICES", "2"}});
  auto idle = holder(48, daemon.client_env({{"CUDA_MPS_CLIENT_PRIORITY", "1"}}));
  REQUIRE(idle->wait_for_output("READY", 60s));
  // Its 64 MiB on GPU 0 are the idle client's 48 and 16 new: GPU 1's server maps both to copy.
  const Outcome normal = run_client(daemon, {client(), "peer_holder", "64"});
  INFO(normal.out << normal.err << daemon.log());
  CHECK(normal.exit_code == 0);
  CHECK(normal.out.find("PASS peer_holder\n") != std::string::npos);
  CHECK(daemon.log().find("made of 48 MiB of memory taken from preempted clients and 16 MiB new") !=
        std::string::npos);
  CHECK(eventually([&] { return state_of(daemon, idle->pid()) == "active"; }));
  ends_with_its_bytes_intact(*idle);
}

TEST_CASE("--memory-preemption suspends no below-normal client that is not idle long enough",
          "[e2e][suspend][policy]") {
  Daemon daemon({"--memory-preemption", "on", "--preemption-idle-ms", "600000"}, kSmallGpu);
  auto recent = holder(48, daemon.client_env({{"CUDA_MPS_CLIENT_PRIORITY", "1"}}));
  REQUIRE(recent->wait_for_output("READY", 60s));
  auto normal = holder(64, daemon.client_env());
  REQUIRE(normal->wait_for_output("READY", 60s));
  INFO(normal->out() << daemon.log());
  // CUDA_ERROR_OUT_OF_MEMORY, as without the policy.
  CHECK(normal->out().find("ALLOC 2\n") != std::string::npos);
  CHECK(state_of(daemon, recent->pid()) == "active");
  ends_with_its_bytes_intact(*normal, "PASS holder, nothing held");
  ends_with_its_bytes_intact(*recent);
}

TEST_CASE(
    "--memory-overcommit: an allocation that does not fit waits suspended, and admission "
    "keeps the clients' limits within the percentage",
    "[e2e][suspend][policy]") {
  // 200% of 96 MiB: the clients' limits may add up to 192 MiB.
  Daemon daemon({"--memory-overcommit", "200"}, kSmallGpu);
  auto limited = [&](const char* limit) {
    return daemon.client_env({{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limit}});
  };
  auto first = holder(64, limited("0=80M"));
  REQUIRE(first->wait_for_output("READY", 60s));
  REQUIRE(first->out().find("ALLOC 0\n") != std::string::npos);

  // 64 MiB more do not fit: the second client waits, suspended, its cuMemAlloc unanswered.
  auto second = holder(64, limited("0=80M"));
  REQUIRE(eventually([&] { return state_of(daemon, second->pid()) == "mem-wait"; }));
  CHECK(second->out().find("ALLOC") == std::string::npos);

  // 80 + 80 + 40 MiB of limits are more than 192 MiB: a third client is not admitted.
  const Outcome third = run_client(daemon, {client(), "holder", "8"},
                                   {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=40M"}});
  CHECK(third.exit_code != 0);
  CHECK(daemon.log().find("more than the 200% of its 96 MiB that --memory-overcommit allows") !=
        std::string::npos);
  ends_with_its_bytes_intact(*first);
  // The first client's memory freed, the second is resumed and its allocation answered.
  REQUIRE(second->wait_for_output("READY", 60s));
  INFO(second->out() << daemon.log());
  CHECK(second->out().find("ALLOC 0\n") != std::string::npos);
  CHECK(state_of(daemon, second->pid()) == "active");
  ends_with_its_bytes_intact(*second);
}

TEST_CASE("--memory-overcommit fails at once an allocation that could never fit",
          "[e2e][suspend][policy]") {
  Daemon daemon({"--memory-overcommit", "200"}, kSmallGpu);
  const Outcome huge = run_client(daemon, {client(), "holder", "100"},
                                  {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=128M"}});
  INFO(huge.out << huge.err << daemon.log());
  CHECK(huge.exit_code == 0);
  CHECK(huge.out.find("ALLOC 2\n") != std::string::npos);
  CHECK(daemon.log().find("could never fit") != std::string::npos);
}

namespace {

// vmm_client's line when every byte it held came back.
const std::string kVmmPass = "PASS hold-check failures=0";

// A vmm_client `hold-check MB` (one cuMemCreate mapped and written, then idle until its stdin
// closes, then its bytes checked), started.
std::unique_ptr<Child> vmm_holder(int megabytes, std::map<std::string, std::string> env) {
  return std::make_unique<Child>(
      std::vector<std::string>{artefact("E2E_VMM_CLIENT"), "hold-check", std::to_string(megabytes)},
      env, true);
}

}  // namespace

TEST_CASE(
    "cuMemCreate, cuMemAllocPitch and cuMemAllocAsync wait for the policies as cuMemAlloc does, "
    "and a client holding cuMemCreate memory can be preempted",
    "[e2e][suspend][policy]") {
  Daemon daemon({"--memory-preemption", "on", "--preemption-idle-ms", "0"}, kSmallGpu);
  const auto below_normal = daemon.client_env({{"CUDA_MPS_CLIENT_PRIORITY", "1"}});
  SECTION("preemption: a normal client's cuMemCreate suspends an idle below-normal one") {
    auto idle = holder(48, below_normal);
    REQUIRE(idle->wait_for_output("READY", 60s));
    makes_room_and_gets_it_back(daemon, *idle, "PASS holder", vmm_holder(64, daemon.client_env()),
                                kVmmPass);
    CHECK(daemon.log().find("cuMemCreate of 64 MiB does not fit on the GPU; it waits") !=
          std::string::npos);
  }
  SECTION("preemption: a normal client's cuMemAllocPitch suspends an idle below-normal one") {
    auto idle = holder(48, below_normal);
    REQUIRE(idle->wait_for_output("READY", 60s));
    auto normal = holder(64, daemon.client_env(), "pitch_holder");
    REQUIRE(normal->wait_for_output("READY", 60s));
    // The answer that waited carries the pitch.
    CHECK(normal->out().find("ALLOC 0\nPITCH 1024\n") != std::string::npos);
    makes_room_and_gets_it_back(daemon, *idle, "PASS holder", std::move(normal), "PASS holder");
    CHECK(daemon.log().find("cuMemAllocPitch of 64 MiB does not fit on the GPU; it waits") !=
          std::string::npos);
  }
  SECTION("preemption: a normal client's cuMemAllocAsync suspends an idle below-normal one") {
    auto idle = holder(48, below_normal);
    REQUIRE(idle->wait_for_output("READY", 60s));
    auto normal = holder(64, daemon.client_env(), "async_holder");
    REQUIRE(normal->wait_for_output("READY", 60s));
    {
      INFO(normal->out() << daemon.log());
      // Made of the preempted client's memory too, cleared.
      CHECK(normal->out().find("ALLOC 0\nFRESH zero\n") != std::string::npos);
      CHECK(daemon.log().find("cuMemAllocAsync of 64 MiB does not fit on the GPU; it waits") !=
            std::string::npos);
      CHECK(daemon.log().find(
                "made of 48 MiB of memory taken from preempted clients and 16 MiB new") !=
            std::string::npos);
    }
    makes_room_and_gets_it_back(daemon, *idle, "PASS holder", std::move(normal), "PASS holder");
  }
  SECTION("preemption: the idle below-normal client holding cuMemCreate memory makes room") {
    auto idle = vmm_holder(48, below_normal);
    REQUIRE(idle->wait_for_output("READY", 60s));
    // Its cuMemCreate memory goes to the normal client's cuMemAlloc, cleared (every byte was 7),
    // and comes back with its bytes. The suspend's copy mapped it where the allocation goes, and
    // there it stays (handover_range.hpp).
    auto normal = holder(64, daemon.client_env());
    REQUIRE(normal->wait_for_output("READY", 60s));
    {
      INFO(normal->out() << daemon.log());
      CHECK(normal->out().find("ALLOC 0\nFRESH zero\n") != std::string::npos);
      CHECK(daemon.log().find(
                "made of 48 MiB of memory taken from preempted clients and 16 MiB new: 2 physical "
                "allocations, 1 of them mapped there by their clients' suspends") !=
            std::string::npos);
    }
    makes_room_and_gets_it_back(daemon, *idle, kVmmPass, std::move(normal), "PASS holder");
  }
}

TEST_CASE("under --memory-overcommit a cuMemCreate that does not fit waits suspended",
          "[e2e][suspend][policy]") {
  Daemon daemon({"--memory-overcommit", "200"}, kSmallGpu);
  const auto limited = daemon.client_env({{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80M"}});
  auto first = holder(64, limited);
  REQUIRE(first->wait_for_output("READY", 60s));
  auto second = vmm_holder(64, limited);
  REQUIRE(eventually([&] { return state_of(daemon, second->pid()) == "mem-wait"; }));
  CHECK(second->out().find("READY") == std::string::npos);
  ends_with_its_bytes_intact(*first);
  INFO(second->out() << daemon.log());
  REQUIRE(second->wait_for_output("READY", 60s));
  CHECK(daemon.log().find("its cuMemCreate of 64 MiB fits after") != std::string::npos);
  CHECK(state_of(daemon, second->pid()) == "active");
  ends_with_its_bytes_intact(*second, kVmmPass);
}

TEST_CASE("--memory-overcommit holds a limit the operator raises to the percentage",
          "[e2e][suspend][policy]") {
  // 150% of 96 MiB: the clients' limits may add up to 144 MiB.
  Daemon daemon({"--memory-overcommit", "150"}, kSmallGpu);
  const auto limited = daemon.client_env({{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"}});
  auto first = holder(8, limited);
  auto second = holder(8, limited);
  REQUIRE(first->wait_for_output("READY", 60s));
  REQUIRE(second->wait_for_output("READY", 60s));
  const std::string pid = std::to_string(first->pid());
  // 96 + 64 MiB are more than 144: refused, the limit unchanged.
  const Outcome raised = daemon.ctl({"set_device_pinned_mem_limit", "0", pid, "96M"});
  INFO(raised.out << raised.err << daemon.log());
  CHECK(raised.exit_code != 0);
  CHECK((raised.out + raised.err)
            .find("not changed: a memory limit of 96 MiB would bring the "
                  "limits of this GPU's clients to 160 MiB") != std::string::npos);
  CHECK(ps_entry(daemon, first->pid())["memory_limit_bytes"].get<long long>() == 64 * kMiB);
  // 72 + 64 MiB are within it: allowed.
  CHECK(daemon.ctl({"set_device_pinned_mem_limit", "0", pid, "72M"}).exit_code == 0);
  CHECK(ps_entry(daemon, first->pid())["memory_limit_bytes"].get<long long>() == 72 * kMiB);
  // A client that is not there is named as such.
  const Outcome nobody = daemon.ctl({"set_device_pinned_mem_limit", "0", "999999", "96M"});
  CHECK((nobody.out + nobody.err).find("no client with pid 999999") != std::string::npos);
  ends_with_its_bytes_intact(*first);
  ends_with_its_bytes_intact(*second);
}

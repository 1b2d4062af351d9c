// Per-allocation quotas (docs/kubernetes.md) through the real daemon, server and shim: a client
// presenting an allocation token gets at most the token's quota, whatever it asks; an unknown
// token is refused; the clients of one token share its memory limit.
#include <signal.h>
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

constexpr unsigned kTestDeviceSms = 132;  // the test driver's device
constexpr unsigned kSmsOf25Percent = 40;  // ceil(132 * 25%) = 33, rounded up to 8-SM groups
constexpr unsigned kSmsOf50Percent = 72;  // ceil(132 * 50%) = 66 -> 72

std::string client() {
  return artefact("E2E_CLIENT");
}

unsigned long long field(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + "=([0-9]+)"))) return ~0ull;
  return std::stoull(m[1]);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Registration {
  unsigned id = 0;
  std::string token;
};

// `mpsshimctl register_allocation ...` -> its id and token.
Registration register_allocation(const Daemon& daemon, std::vector<std::string> words) {
  words.insert(words.begin(), "register_allocation");
  Outcome o = daemon.ctl(words);
  INFO("mpsshimctl: " << o.out << o.err);
  REQUIRE(o.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(o.out, m, std::regex("allocation=([0-9]+) token=([0-9a-f]{32})")));
  return Registration{static_cast<unsigned>(std::stoul(m[1])), m[2]};
}

}  // namespace

TEST_CASE("a client asking 100% with a 25% token gets 25%, and the clamp is logged",
          "[e2e][allocation]") {
  Daemon daemon;
  Registration sut = register_allocation(daemon, {"sm=25", "namespace=team-a", "pod=trainer-0"});

  Outcome o = run_client(
      daemon, {client(), "quota"},
      {{"MPSSHIM_ALLOCATION_TOKEN", sut.token}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"}});

  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
  REQUIRE(o.exit_code == 0);
  CHECK(field(o.out, "sms") == kSmsOf25Percent);
  CHECK(contains(daemon.log(),
                 "asked for 100% of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); its "
                 "allocation " +
                     std::to_string(sut.id) +
                     " (pod team-a/trainer-0) allows 25%; clamped to 25%"));
  // Asking for less than the token allows is honoured.
  Outcome lower = run_client(
      daemon, {client(), "quota"},
      {{"MPSSHIM_ALLOCATION_TOKEN", sut.token}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "5"}});
  REQUIRE(lower.exit_code == 0);
  CHECK(field(lower.out, "sms") < kSmsOf25Percent);
}

TEST_CASE("the token file works like the variable", "[e2e][allocation]") {
  Daemon daemon;
  Registration sut = register_allocation(daemon, {"sm=25"});
  std::string path = daemon.dir() + "/token";
  {
    std::ofstream file(path);
    file << sut.token << "\n";
  }

  Outcome o = run_client(daemon, {client(), "quota"}, {{"MPSSHIM_ALLOCATION_TOKEN_FILE", path}});

  INFO("stdout: " << o.out << "\nstderr: " << o.err);
  REQUIRE(o.exit_code == 0);
  CHECK(field(o.out, "sms") == kSmsOf25Percent);
}

TEST_CASE("a forged or revoked token is refused with a sentence saying why", "[e2e][allocation]") {
  Daemon daemon;
  Registration real = register_allocation(daemon, {"sm=25"});
  std::string forged = real.token;
  forged[0] = forged[0] == 'a' ? 'b' : 'a';

  Outcome o = run_client(daemon, {client(), "basic", "16"}, {{"MPSSHIM_ALLOCATION_TOKEN", forged}});

  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
  CHECK(o.exit_code != 0);
  CHECK(contains(o.out, "CUDA_ERROR_MPS_CONNECTION_FAILED"));
  CHECK(contains(o.err, "allocation token"));
  CHECK(contains(daemon.log(), "allocation token (MPSSHIM_ALLOCATION_TOKEN) is not one"));

  REQUIRE(daemon.ctl({"revoke_allocation", std::to_string(real.id)}).exit_code == 0);
  Outcome revoked =
      run_client(daemon, {client(), "basic", "16"}, {{"MPSSHIM_ALLOCATION_TOKEN", real.token}});
  CHECK(revoked.exit_code != 0);
  CHECK(contains(revoked.out, "CUDA_ERROR_MPS_CONNECTION_FAILED"));
}

TEST_CASE("two processes with one token share its memory limit", "[e2e][allocation]") {
  Daemon daemon;
  Registration sut = register_allocation(daemon, {"memory=64M", "namespace=ns", "pod=p"});
  auto env = daemon.client_env({{"MPSSHIM_ALLOCATION_TOKEN", sut.token}});

  // The first holds 40 MiB of the 64.
  Child holder({client(), "hog", "40"}, env);
  REQUIRE(holder.wait_for_output("READY", 60s));
  // The second alone would fit (32 < 64), but not with the first's 40.
  Outcome second =
      run_client(daemon, {client(), "overlimit", "32"}, {{"MPSSHIM_ALLOCATION_TOKEN", sut.token}});
  INFO("stdout: " << second.out << "\nstderr: " << second.err << "\ndaemon log:\n" << daemon.log());
  CHECK(second.exit_code == 0);  // "overlimit" passes when the allocation is refused
  CHECK(contains(daemon.log(),
                 "its allocation " + std::to_string(sut.id) + " shares a limit of 64 MiB"));
  // ps names the allocation and its pod for both.
  Outcome ps = daemon.ctl({"ps"});
  CHECK(contains(ps.out, "ALLOCATION"));
  CHECK(contains(ps.out, std::to_string(sut.id) + " ns/p"));
  // ps --json carries the allocation and its pod for scripts.
  const nlohmann::json listed = nlohmann::json::parse(daemon.ctl({"ps", "--json"}).out);
  INFO("ps --json: " << listed.dump());
  REQUIRE(!listed["clients"].empty());
  const nlohmann::json& entry = listed["clients"][0];
  CHECK(entry["allocation"] == sut.id);
  CHECK(entry["namespace"] == "ns");
  CHECK(entry["pod"] == "p");
  CHECK(entry["memory_used_bytes"] == 40 << 20);

  holder.kill(SIGKILL);
  holder.wait();
  // Once the first has gone (and its session was freed), the same request fits.
  bool fits = false;
  for (int attempt = 0; attempt < 100 && !fits; ++attempt) {
    Outcome again = run_client(daemon, {client(), "overlimit", "32"},
                               {{"MPSSHIM_ALLOCATION_TOKEN", sut.token}});
    fits = contains(again.out, "rc=0");
    if (!fits) std::this_thread::sleep_for(100ms);
  }
  CHECK(fits);
}

TEST_CASE("a node that requires tokens gives a token-less client the default, not what it asks",
          "[e2e][allocation]") {
  Daemon daemon({"--require-allocation-token", "--default-sm-percentage", "50"});

  Outcome o =
      run_client(daemon, {client(), "quota"}, {{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"}});

  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
  REQUIRE(o.exit_code == 0);
  CHECK(field(o.out, "sms") == kSmsOf50Percent);
  CHECK(contains(daemon.log(), "has no allocation token and asked for 100% of the SMs"));
  // With a token, the token decides (here more than the node default).
  Registration sut = register_allocation(daemon, {"sm=100"});
  Outcome with_token =
      run_client(daemon, {client(), "quota"}, {{"MPSSHIM_ALLOCATION_TOKEN", sut.token}});
  REQUIRE(with_token.exit_code == 0);
  CHECK(field(with_token.out, "sms") == kTestDeviceSms);
}

TEST_CASE("a token bound to another GPU is refused", "[e2e][allocation]") {
  Daemon daemon;
  Registration sut = register_allocation(daemon, {"sm=25", "gpus=1"});

  Outcome o =
      run_client(daemon, {client(), "basic", "16"}, {{"MPSSHIM_ALLOCATION_TOKEN", sut.token}});

  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
  CHECK(o.exit_code != 0);
  CHECK(contains(daemon.log(), "holds GPU 1, not GPU 0"));
}

TEST_CASE(
    "allocations of different slots run on different SMs, one allocation's clients on one set",
    "[e2e][allocation]") {
  Daemon daemon;
  Registration first = register_allocation(daemon, {"sm=25", "slot=0/4"});
  Registration third = register_allocation(daemon, {"sm=25", "slot=2/4"});

  Outcome a = run_client(daemon, {client(), "quota"}, {{"MPSSHIM_ALLOCATION_TOKEN", first.token}});
  Outcome b = run_client(daemon, {client(), "quota"}, {{"MPSSHIM_ALLOCATION_TOKEN", third.token}});
  Outcome b_again =
      run_client(daemon, {client(), "quota"}, {{"MPSSHIM_ALLOCATION_TOKEN", third.token}});

  INFO("a: " << a.out << a.err << "\nb: " << b.out << b.err << "\ndaemon log:\n" << daemon.log());
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  CHECK(field(a.out, "sms") == kSmsOf25Percent);
  CHECK(field(b.out, "sms") == kSmsOf25Percent);
  CHECK(field(a.out, "lowest") == 0);
  // Slot 2 of 4 starts half way: its SMs do not overlap slot 0's first 40.
  CHECK(field(b.out, "lowest") >= kSmsOf25Percent);
  CHECK(field(b_again.out, "lowest") == field(b.out, "lowest"));
}

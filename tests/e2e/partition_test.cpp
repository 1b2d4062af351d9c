// Static SM partitions through the real daemon, server and shim (docs/daemon.md): mpsshimctl
// sm_partition add cuts non-overlapping partitions from the test driver's 132 SMs (15 groups of
// 8 within its GPCs: 0-7, 8-15, 18-25, 26-33, 36-43, ...) and refuses one that does not fit;
// clients pinned with CUDA_MPS_SM_PARTITION run on their partition's SMs only (the e2e client's
// `quota` mode launches record_smid over every SM and prints how many distinct SMs it saw and the
// lowest); an unknown id is refused; a partition with a client in it cannot be removed; lspart
// --json lists them with their clients.
#include <signal.h>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "harness.hpp"

using namespace mpsshim::e2e;

namespace {

unsigned long long field(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + "=([0-9]+)"))) return ~0ull;
  return std::stoull(m[1]);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// `sm_partition add 0 <sms>` -> the answer's fields.
std::string add_partition(const Daemon& daemon, const std::string& sms) {
  Outcome o = daemon.ctl({"sm_partition", "add", "0", sms});
  INFO("mpsshimctl: " << o.out << o.err);
  REQUIRE(o.exit_code == 0);
  return o.out;
}

}  // namespace

TEST_CASE("clients pinned to different SM partitions run on disjoint SMs", "[e2e][partition]") {
  Daemon daemon;
  const std::string first = add_partition(daemon, "16");
  const std::string second = add_partition(daemon, "20");  // rounded up to 24
  CHECK(contains(first, "groups=0-1 sms=16"));
  CHECK(contains(second, "groups=2-4 sms=24"));

  // Groups 5-14 are left (80 SMs): 100 SMs do not fit, and the answer says what is free.
  Outcome too_big = daemon.ctl({"sm_partition", "add", "0", "100"});
  CHECK(too_big.exit_code == 1);
  CHECK(contains(too_big.out + too_big.err, "free: groups 5-14 (80 SMs)"));

  const std::string a_id = std::to_string(field(first, "partition"));
  const std::string b_id = std::to_string(field(second, "partition"));
  Outcome a =
      run_client(daemon, {artefact("E2E_CLIENT"), "quota"}, {{"CUDA_MPS_SM_PARTITION", a_id}});
  Outcome b =
      run_client(daemon, {artefact("E2E_CLIENT"), "quota"}, {{"CUDA_MPS_SM_PARTITION", b_id}});
  INFO("a: " << a.out << a.err << "\nb: " << b.out << b.err << "\ndaemon log:\n" << daemon.log());
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  CHECK(field(a.out, "sms") == 16);
  CHECK(field(a.out, "distinct") == 16);
  CHECK(field(a.out, "lowest") == 0);
  CHECK(field(b.out, "sms") == 24);
  CHECK(field(b.out, "distinct") == 24);
  CHECK(field(b.out, "lowest") == 18);  // SMs 18-33 and 36-43: none of a's 0-15

  // Unknown and malformed ids are refused at cuInit, never run elsewhere.
  Outcome unknown =
      run_client(daemon, {artefact("E2E_CLIENT"), "quota"}, {{"CUDA_MPS_SM_PARTITION", "77"}});
  CHECK(unknown.exit_code != 0);
  CHECK(contains(daemon.log(), "CUDA_MPS_SM_PARTITION=77: no such SM partition"));
  Outcome malformed =
      run_client(daemon, {artefact("E2E_CLIENT"), "quota"}, {{"CUDA_MPS_SM_PARTITION", "abc"}});
  CHECK(malformed.exit_code != 0);

  Outcome removed = daemon.ctl({"sm_partition", "rm", b_id});
  CHECK(removed.exit_code == 0);
  Outcome listed = daemon.ctl({"lspart", "--json"});
  REQUIRE(listed.exit_code == 0);
  auto json = nlohmann::json::parse(listed.out);
  REQUIRE(json["partitions"].size() == 1);
  CHECK(json["partitions"][0]["id"] == field(first, "partition"));
  CHECK(json["partitions"][0]["sms"] == 16);
  CHECK(daemon.ctl({"sm_partition", "rm", b_id}).exit_code == 1);  // already gone
}

TEST_CASE("a partition with a client in it is not removed", "[e2e][partition]") {
  Daemon daemon;
  const std::string id = std::to_string(field(add_partition(daemon, "8"), "partition"));
  // The `hog` client keeps working until it is killed.
  Child holder({artefact("E2E_CLIENT"), "hog", "1"},
               daemon.client_env({{"CUDA_MPS_SM_PARTITION", id}}));
  REQUIRE(holder.wait_for_output("READY", std::chrono::seconds(60)));

  Outcome refused = daemon.ctl({"sm_partition", "rm", id});
  CHECK(refused.exit_code == 1);
  CHECK(contains(refused.out + refused.err, "clients run in partition " + id));
  Outcome listed = daemon.ctl({"lspart"});
  CHECK(contains(listed.out, std::to_string(holder.pid())));

  holder.kill(SIGKILL);
  holder.wait(std::chrono::seconds(30));
  // The server frees the session once it noticed the hang-up and the work drained.
  bool removed = false;
  for (int i = 0; i < 100 && !removed; ++i) {
    removed = daemon.ctl({"sm_partition", "rm", id}).exit_code == 0;
    if (!removed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(removed);
}

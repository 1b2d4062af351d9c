// Green contexts a client makes itself, through the whole path on the CPU: green_client under
// LD_PRELOAD=libmpsshim.so -> mpsshimd -> mpsshim-server -> the host-memory test driver
// (docs/green-contexts.md).
#include <catch2/catch.hpp>

#include <string>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;

namespace {

std::string client() {
  return artefact("E2E_GREEN_CLIENT");
}

}  // namespace

TEST_CASE("a client's green contexts are carved out of its quota and go with it", "[e2e][green]") {
  const char* percentage = GENERATE("", "50");
  INFO("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" << percentage);
  std::map<std::string, std::string> env;
  if (*percentage != '\0') env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = percentage;
  // The primary context is kept, so the driver's objects move only with the clients.
  Daemon daemon({"--context-idle-timeout", "-1"});
  // Once to fill the server's green-context pool, then again: nothing of the second stays.
  require_pass(run_client(daemon, {client()}, env), daemon);
  REQUIRE(eventually([&] { return ps_pids(daemon).empty(); }));
  const std::map<std::string, long long> before = daemon.driver_objects();
  REQUIRE(!before.empty());
  const Outcome second = run_client(daemon, {client()}, env);
  require_pass(second, daemon);
  if (*percentage != '\0') CHECK(second.out.find("sms=132 ") == std::string::npos);
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] {
    const auto after = daemon.driver_objects();
    return after.at("green_contexts") == before.at("green_contexts") &&
           after.at("streams") == before.at("streams") &&
           after.at("device_bytes") == before.at("device_bytes");
  }));
  CHECK(daemon.log().find("not implemented") == std::string::npos);
}

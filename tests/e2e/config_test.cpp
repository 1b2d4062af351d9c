// mpsshimd --config through the whole path (docs/config.md): a class clamps what its clients
// ask and may make them an isolation group; `mpsshimctl reload` applies a changed file and
// refuses a broken one, keeping the old configuration.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "harness.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

// The `ps --json` entry of client `pid` (null when it is not listed).
nlohmann::json client_entry(const Daemon& daemon, int pid) {
  Outcome ps = daemon.ctl({"ps", "--json"});
  auto parsed = nlohmann::json::parse(ps.out, nullptr, false);
  if (parsed.is_discarded()) return nullptr;
  for (const auto& client : parsed["clients"]) {
    if (client["pid"] == pid) return client;
  }
  return nullptr;
}

std::string class_file(int max_sm_percentage) {
  return "default-sm-percentage = 80\n\n[[class]]\nname = \"mine\"\nuids = [" +
         std::to_string(::getuid()) +
         "]\nmax_sm_percentage = " + std::to_string(max_sm_percentage) +
         "\nmax_memory_limit = \"64M\"\nisolation = \"class\"\n";
}

}  // namespace

TEST_CASE("a config file's class clamps its clients and isolates them; reload applies changes",
          "[e2e][config]") {
  char pattern[] = "/tmp/mpsshim-config-XXXXXX";
  const int fd = ::mkstemp(pattern);
  REQUIRE(fd >= 0);
  ::close(fd);
  const std::string path = pattern;
  std::ofstream(path) << class_file(25);
  Daemon daemon({"--config", path});

  auto start = [&] {
    auto child = std::make_unique<Child>(
        std::vector<std::string>{artefact("E2E_CLIENT"), "peek", "0"},
        daemon.client_env({{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "60"}}), true);
    INFO("client: " << child->out() << child->err() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(child->wait_for_output("READY", 60s));
    return child;
  };
  auto first = start();
  nlohmann::json entry = client_entry(daemon, first->pid());
  INFO("ps: " << entry.dump() << "\ndaemon log:\n" << daemon.log());
  CHECK(entry["sm_percentage"] == 25);
  CHECK(entry["memory_limit_bytes"] == 64 << 20);
  CHECK(entry["isolation_group"] == "class:mine");
  CHECK(daemon.log().find("asked for 60% of the SMs; its class `mine` allows 25%") !=
        std::string::npos);

  // A broken file is refused with its line; the old configuration stays.
  std::ofstream(path) << "[[class]]\nname = \"mine\"\nmax_sm_percentage = 500\n";
  Outcome broken = daemon.ctl({"reload"});
  CHECK(broken.exit_code != 0);
  const std::string said = broken.out + broken.err;
  CHECK(said.find(path + ":1: max_sm_percentage") != std::string::npos);
  CHECK(said.find("the old one stays") != std::string::npos);
  auto second = start();
  CHECK(client_entry(daemon, second->pid())["sm_percentage"] == 25);

  // A changed file applies to the next client; those running keep what they got.
  std::ofstream(path) << class_file(50);
  Outcome reloaded = daemon.ctl({"reload"});
  INFO("reload: " << reloaded.out);
  CHECK(reloaded.exit_code == 0);
  auto third = start();
  CHECK(client_entry(daemon, third->pid())["sm_percentage"] == 50);
  CHECK(client_entry(daemon, first->pid())["sm_percentage"] == 25);
  for (auto* child : {first.get(), second.get(), third.get()}) child->kill(SIGKILL);
  ::unlink(path.c_str());
}

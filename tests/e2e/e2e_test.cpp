// The whole path on the CPU: LD_PRELOAD=libmpsshim.so client -> mpsshimd -> mpsshim-server ->
// host-memory test driver, with real processes, sockets and shared memory.
#define CATCH_CONFIG_MAIN
#include <signal.h>
#include <catch2/catch.hpp>

#include <regex>
#include <thread>

#include "harness.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

std::string client() {
  return artefact("E2E_CLIENT");
}

unsigned long long field(const std::string& text, const std::string& key) {
  std::smatch m;
  std::regex re(key + "=([0-9]+)");
  if (!std::regex_search(text, m, re)) return ~0ull;
  return std::stoull(m[1]);
}

void require_pass(const Outcome& o, const Daemon& d) {
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << d.log());
  REQUIRE(o.exit_code == 0);
  REQUIRE(o.out.find("PASS") != std::string::npos);
}

}  // namespace

TEST_CASE("a driver-API client runs through the daemon and the test driver", "[e2e]") {
  Daemon daemon;
  Outcome o = run_client(daemon, {client(), "basic", "100000"});
  require_pass(o, daemon);
}

TEST_CASE("the examples give correct results through the broker", "[e2e]") {
  Daemon daemon;
  for (const char* name : {"EXAMPLE_VECTOR_ADD", "EXAMPLE_MATMUL_TILED", "EXAMPLE_STREAMS_EVENTS",
                           "EXAMPLE_PINNED_ASYNC"}) {
    const char* path = std::getenv(name);
    if (path == nullptr) continue;  // examples need nvcc to build
    SECTION(name) {
      std::vector<std::string> argv = {path};
      if (std::string(name) == "EXAMPLE_MATMUL_TILED")
        argv.insert(argv.end(), {"--m", "128", "--n", "128", "--k", "128"});
      require_pass(run_client(daemon, argv), daemon);
    }
  }
}

TEST_CASE("managed memory is refused and registered host memory is staged", "[e2e][hostmem]") {
  Daemon daemon;
  // Bigger than one staging chunk, and an odd count, so copies take several pieces.
  require_pass(run_client(daemon, {client(), "hostmem", "1000003"}), daemon);
  require_pass(run_client(daemon, {client(), "hostmem", "17"}), daemon);
}

TEST_CASE("eight clients at once all get their own correct results", "[e2e]") {
  Daemon daemon;
  std::vector<std::unique_ptr<Child>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<Child>(
        std::vector<std::string>{client(), "basic", std::to_string(50000 + 1000 * i)},
        daemon.client_env()));
  }
  for (auto& c : clients) require_pass(c->wait(120s), daemon);
}

TEST_CASE("a client killed mid-stream is cleaned up and the others finish", "[e2e]") {
  Daemon daemon;
  Outcome before = run_client(daemon, {client(), "meminfo"});
  require_pass(before, daemon);
  unsigned long long free_before = field(before.out, "free");

  Child hog({client(), "hog", "512"}, daemon.client_env());
  REQUIRE(hog.wait_for_output("READY", 60s));
  unsigned long long free_during = field(hog.out(), "free");
  CHECK(free_during + (512ull << 20) <= free_before);
  Outcome ps = daemon.ctl({"ps"});
  INFO("ps: " << ps.out);
  CHECK(ps.out.find(std::to_string(hog.pid())) != std::string::npos);

  std::vector<std::unique_ptr<Child>> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::make_unique<Child>(std::vector<std::string>{client(), "basic", "200000"},
                                             daemon.client_env()));
  }
  hog.kill(SIGKILL);
  CHECK(hog.wait(30s).exit_code == -SIGKILL);
  for (auto& c : others) require_pass(c->wait(120s), daemon);

  // Its memory comes back: a new client sees as much free memory as before.
  unsigned long long free_after = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    Outcome after = run_client(daemon, {client(), "meminfo"});
    require_pass(after, daemon);
    free_after = field(after.out, "free");
    if (free_after == free_before) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO("daemon log:\n" << daemon.log());
  CHECK(free_after == free_before);
  CHECK(daemon.ctl({"ps"}).out.find(std::to_string(hog.pid())) == std::string::npos);
}

TEST_CASE("a client cannot reach memory it does not own; the server survives", "[e2e]") {
  Daemon daemon;
  Child owner({client(), "pointer"}, daemon.client_env());
  REQUIRE(owner.wait_for_output("POINTER", 60s));
  std::smatch m;
  std::string text = owner.out();
  REQUIRE(std::regex_search(text, m, std::regex("POINTER ([0-9]+)")));
  unsigned long long foreign = std::stoull(m[1]);
  Outcome o = run_client(daemon, {client(), "forge", std::to_string(foreign)});
  require_pass(o, daemon);
  require_pass(run_client(daemon, {client(), "basic", "1000"}), daemon);
  owner.kill(SIGKILL);
}

TEST_CASE("a memory limit is enforced with a message naming it", "[e2e]") {
  Daemon daemon;
  Outcome o = run_client(daemon, {client(), "overlimit", "128"},
                         {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"}});
  require_pass(o, daemon);
  CHECK(field(o.out, "total") == (64ull << 20));
  CHECK(daemon.log().find("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != std::string::npos);
}

TEST_CASE("an SM quota sizes the client's green context and is what it sees", "[e2e]") {
  Daemon daemon;
  Outcome o =
      run_client(daemon, {client(), "quota"}, {{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"}});
  require_pass(o, daemon);
  // 25% of the test device's 132 SMs, rounded up to the 8-SM partition granularity.
  CHECK(field(o.out, "sms") == 40);
  CHECK(field(o.out, "distinct") <= 40);
  Outcome full = run_client(daemon, {client(), "quota"});
  require_pass(full, daemon);
  CHECK(field(full.out, "sms") == 132);
}

TEST_CASE("without a daemon cuInit fails and says how to start one", "[e2e]") {
  std::map<std::string, std::string> env = {{"CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/mpsshim"},
                                            {"LD_PRELOAD", artefact("LIBMPSSHIM")}};
  Child c({client(), "basic", "16"}, env);
  Outcome o = c.wait(30s);
  INFO("stdout: " << o.out << "\nstderr: " << o.err);
  CHECK(o.exit_code != 0);
  CHECK(o.out.find("CUDA_ERROR_MPS_CONNECTION_FAILED") != std::string::npos);
  CHECK(o.err.find("/nonexistent/mpsshim/control") != std::string::npos);
  CHECK(o.err.find("mpsshimd") != std::string::npos);
}

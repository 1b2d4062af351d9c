// NVML as a client sees its share (libmpsshim-nvml.so, docs/nvml.md), end to end: a real daemon
// and server on the host-memory test driver, real clients holding memory, and a program reading
// NVML through libmpsshim-nvml.so in front of a stand-in for the real library (fake_nvml.cpp).
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"
#include "tests/e2e/harness.hpp"

using namespace mpsshim::e2e;
using Fields = std::map<std::string, std::string>;

namespace {

constexpr unsigned long long kMiB = 1ull << 20;
constexpr unsigned long long kGiB = 1ull << 30;
// What the e2e client's `account` mode holds while it waits: 3 MiB of device memory.
constexpr unsigned long long kAccountHeld = 3 * kMiB;

std::string nvml_preload() {
  const char* first = std::getenv("SANITIZER_PRELOAD");
  std::string lib = artefact("LIBMPSSHIM_NVML");
  return first == nullptr || *first == '\0' ? lib : std::string(first) + " " + lib;
}

std::string daemon_uuids(const Daemon& daemon) {
  Outcome query = daemon.ctl({"--json", "device_query"});
  REQUIRE(query.exit_code == 0);
  std::string uuids;
  const nlohmann::json answer = nlohmann::json::parse(query.out);
  for (const auto& gpu : answer.at("gpus")) {
    uuids += (uuids.empty() ? "" : ",") + gpu["uuid"].get<std::string>();
  }
  return uuids;
}

// One line of the probe per device, as fields.
std::vector<Fields> probe(const Daemon& daemon, std::map<std::string, std::string> env,
                          std::string* err = nullptr) {
  env["CUDA_MPS_PIPE_DIRECTORY"] =
      env.contains("CUDA_MPS_PIPE_DIRECTORY") ? env["CUDA_MPS_PIPE_DIRECTORY"] : daemon.dir();
  env["LD_PRELOAD"] = nvml_preload();
  env["MPSSHIM_REAL_NVML"] = artefact("FAKE_NVML");
  env["FAKE_NVML_UUIDS"] = daemon_uuids(daemon);
  Child child({artefact("NVML_PROBE")}, env);
  Outcome outcome = child.wait(std::chrono::seconds(30));
  INFO("probe stdout: " << outcome.out << "\nstderr: " << outcome.err);
  REQUIRE(outcome.exit_code == 0);
  REQUIRE(outcome.out.find("PASS") != std::string::npos);
  if (err != nullptr) *err = outcome.err;
  std::vector<Fields> devices;
  std::istringstream lines(outcome.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("device=")) continue;
    Fields fields;
    std::istringstream words(line);
    for (std::string word; words >> word;) {
      auto eq = word.find('=');
      if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
    devices.push_back(fields);
  }
  return devices;
}

unsigned long long number(const Fields& fields, const std::string& key) {
  auto it = fields.find(key);
  REQUIRE(it != fields.end());
  return std::stoull(it->second);
}

// A client that holds kAccountHeld until its stdin closes.
std::unique_ptr<Child> holding_client(const Daemon& daemon,
                                      std::map<std::string, std::string> env = {}) {
  auto client =
      std::make_unique<Child>(std::vector<std::string>{artefact("E2E_CLIENT"), "account", "1"},
                              daemon.client_env(std::move(env)), true);
  REQUIRE(client->wait_for_output("READY", std::chrono::seconds(60)));
  return client;
}

std::string token_of(const Daemon& daemon, const std::string& memory) {
  Outcome registered = daemon.ctl({"register_allocation", "memory=" + memory});
  REQUIRE(registered.exit_code == 0);
  auto at = registered.out.find("token=");
  REQUIRE(at != std::string::npos);
  std::string token = registered.out.substr(at + 6);
  return token.substr(0, token.find_first_of(" \n"));
}

}  // namespace

TEST_CASE("NVML shows the memory limit, what the cgroup's clients hold and their processes",
          "[nvml]") {
  Daemon daemon;
  auto client = holding_client(daemon, {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "64M"}});
  std::vector<Fields> devices = probe(daemon, {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "64M"}});
  REQUIRE(devices.size() == 1);
  const Fields& gpu = devices[0];
  CHECK(number(gpu, "total") == 64 * kMiB);
  CHECK(number(gpu, "used") == kAccountHeld);
  CHECK(number(gpu, "free") == 64 * kMiB - kAccountHeld);
  CHECK(number(gpu, "v2_total") == 64 * kMiB);
  CHECK(number(gpu, "v2_reserved") == 0);
  CHECK(number(gpu, "v2_used") == kAccountHeld);
  CHECK(gpu.at("processes") == std::to_string(client->pid()) + ":" + std::to_string(kAccountHeld));
  // nvidia-smi's list (the private table) says the same, with the program's name.
  CHECK(gpu.at("table_processes") ==
        std::to_string(client->pid()) + ":" + std::to_string(kAccountHeld) + ":e2e_client");
  // The SMs the client runs on, as ps gives them.
  Outcome ps = daemon.ctl({"--json", "ps"});
  REQUIRE(ps.exit_code == 0);
  auto clients = nlohmann::json::parse(ps.out)["clients"];
  REQUIRE(clients.size() == 1);
  CHECK(number(gpu, "sms") == clients[0]["sms"].get<unsigned long long>());
  // Not measured (no --busy-time on): the GPU's own figure.
  CHECK(number(gpu, "gpu_util") == 77);
  // Forwarded untouched, and missing from the real library: its error, as NVML gives it.
  CHECK(gpu.at("name") == "FakeGPU-80GB");
  CHECK(number(gpu, "power") == 13);
  client->close_stdin();
  CHECK(client->wait().exit_code == 0);
}

TEST_CASE("an allocation's processes see the allocation's share and nobody else's", "[nvml]") {
  Daemon daemon;
  const std::string mine = token_of(daemon, "128M");
  const std::string other = token_of(daemon, "256M");
  auto client = holding_client(daemon, {{"MPSSHIM_ALLOCATION_TOKEN", mine}});
  std::vector<Fields> inside = probe(daemon, {{"MPSSHIM_ALLOCATION_TOKEN", mine}});
  REQUIRE(inside.size() == 1);
  CHECK(number(inside[0], "total") == 128 * kMiB);
  CHECK(number(inside[0], "used") == kAccountHeld);
  CHECK(inside[0].at("processes") ==
        std::to_string(client->pid()) + ":" + std::to_string(kAccountHeld));
  std::vector<Fields> outside = probe(daemon, {{"MPSSHIM_ALLOCATION_TOKEN", other}});
  REQUIRE(outside.size() == 1);
  CHECK(number(outside[0], "total") == 256 * kMiB);
  CHECK(number(outside[0], "used") == 0);
  CHECK(outside[0].at("processes") == "-");
  CHECK(outside[0].at("table_processes") == "-");
  CHECK(number(outside[0], "gpu_util") == 0);
  client->close_stdin();
  CHECK(client->wait().exit_code == 0);
}

TEST_CASE("NVML counts the busy time of the scope's clients", "[nvml]") {
  Daemon daemon({"--busy-time", "on"});
  const std::string busy = token_of(daemon, "1G");
  const std::string idle = token_of(daemon, "1G");
  // Kernels of 2 ms back to back, until killed.
  Child hog({artefact("E2E_CLIENT"), "hog", "1"},
            daemon.client_env({{"MPSSHIM_ALLOCATION_TOKEN", busy}}));
  REQUIRE(hog.wait_for_output("READY", std::chrono::seconds(60)));
  std::vector<Fields> hot = probe(daemon, {{"MPSSHIM_ALLOCATION_TOKEN", busy}});
  REQUIRE(hot.size() == 1);
  CHECK(number(hot[0], "gpu_util") >= 30);
  std::vector<Fields> cold = probe(daemon, {{"MPSSHIM_ALLOCATION_TOKEN", idle}});
  REQUIRE(cold.size() == 1);
  CHECK(number(cold[0], "gpu_util") == 0);
  hog.kill(SIGKILL);
  hog.wait();
}

TEST_CASE("a GPU the process may not use, and a process without a daemon, see the physical GPU",
          "[nvml]") {
  Daemon daemon({}, {{"MPSSHIM_TESTDRIVER_DEVICES", "2"}});
  std::vector<Fields> devices =
      probe(daemon, {{"CUDA_VISIBLE_DEVICES", "1"}, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "32M"}});
  REQUIRE(devices.size() == 2);
  CHECK(number(devices[0], "total") == 80 * kGiB);
  CHECK(number(devices[0], "used") == 10 * kGiB);
  CHECK(number(devices[1], "total") == 32 * kMiB);
  CHECK(number(devices[1], "used") == 0);

  std::string err;
  std::vector<Fields> alone =
      probe(daemon, {{"CUDA_MPS_PIPE_DIRECTORY", daemon.dir() + "/nowhere"}}, &err);
  REQUIRE(alone.size() == 2);
  CHECK(number(alone[0], "total") == 80 * kGiB);
  CHECK(alone[0].at("processes") == "1:" + std::to_string(10 * kGiB));
  CHECK(alone[0].at("table_processes") == "1:" + std::to_string(10 * kGiB) + ":mpsshim-server");
  CHECK(err.find("cannot ask mpsshimd") != std::string::npos);
}

TEST_CASE("views asked at once are each answered for their own scope", "[nvml]") {
  Daemon daemon({"--busy-time", "on"});
  const std::string small = token_of(daemon, "64M");
  const std::string large = token_of(daemon, "512M");
  auto client = holding_client(daemon, {{"MPSSHIM_ALLOCATION_TOKEN", small}});
  std::map<std::string, std::string> env{{"CUDA_MPS_PIPE_DIRECTORY", daemon.dir()},
                                         {"LD_PRELOAD", nvml_preload()},
                                         {"MPSSHIM_REAL_NVML", artefact("FAKE_NVML")},
                                         {"FAKE_NVML_UUIDS", daemon_uuids(daemon)}};
  std::vector<std::unique_ptr<Child>> probes;
  for (int i = 0; i < 16; ++i) {
    auto mine = env;
    mine["MPSSHIM_ALLOCATION_TOKEN"] = i % 2 == 0 ? small : large;
    probes.push_back(
        std::make_unique<Child>(std::vector<std::string>{artefact("NVML_PROBE")}, mine));
  }
  for (int i = 0; i < 16; ++i) {
    Outcome outcome = probes[i]->wait(std::chrono::seconds(30));
    INFO("probe " << i << ": " << outcome.out << outcome.err);
    REQUIRE(outcome.exit_code == 0);
    const std::string total = std::to_string(i % 2 == 0 ? 64 * kMiB : 512 * kMiB);
    const std::string used = std::to_string(i % 2 == 0 ? kAccountHeld : 0);
    CHECK(outcome.out.find(" total=" + total + " ") != std::string::npos);
    CHECK(outcome.out.find(" used=" + used + " ") != std::string::npos);
  }
  client->close_stdin();
  CHECK(client->wait().exit_code == 0);
}

TEST_CASE("a malformed view request ends that connection, not the daemon", "[nvml]") {
  Daemon daemon;
  int fd = mpsshim::proto::connect_seqpacket(daemon.dir() + "/control");
  REQUIRE(fd >= 0);
  mpsshim::proto::UniqueFd socket(fd);
  // A request cut short: the header names kClientView, the bytes are a plain hello's.
  mpsshim::proto::ClientHello hello{};
  hello.header =
      mpsshim::proto::make_header(mpsshim::proto::MessageKind::kClientView, sizeof hello);
  REQUIRE(mpsshim::proto::send_struct(fd, hello) == 0);
  mpsshim::proto::Received reply;
  CHECK(mpsshim::proto::receive_message(fd, reply) == 0);
  CHECK(reply.bytes.empty());  // closed without an answer
  std::vector<Fields> devices = probe(daemon, {});
  CHECK(devices.size() == 1);
  CHECK(daemon.log().find("truncated message of kind 17") != std::string::npos);
}

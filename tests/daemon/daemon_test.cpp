// mpsshimd as a whole: a real daemon process, fake per-GPU servers, real sockets, mpsshimctl.
#include <arpa/inet.h>
#include <cuda.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "broker/daemon/wire.hpp"
#include "tests/daemon/harness.hpp"

using namespace mpsshim;
using namespace mpsshim::daemon_test;
using proto::MessageKind;

namespace {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string admitted(int gpu) {
  return "fake server " + std::to_string(gpu) + " admitted pid " + std::to_string(::getpid());
}

std::string bounded(const proto::Refused& refused) {
  return daemon::bounded_string(refused.message);
}

std::string own_user() {
  passwd* entry = ::getpwuid(::getuid());
  return entry != nullptr ? entry->pw_name : std::to_string(::getuid());
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("a query without CUDA_VISIBLE_DEVICES lists every GPU in order", "[query]") {
  DaemonUnderTest sut({.gpus = 3});

  DeviceList devices = query(sut.socket_path(), "");

  REQUIRE_FALSE(devices.refused);
  CHECK(devices.ordinals == std::vector{0, 1, 2});
}

TEST_CASE(
    "an ABI 1.2 or 1.3 hello, shorter by the allocation token, is served as one without a "
    "token",
    "[query]") {
  DaemonUnderTest sut({.gpus = 2});
  const std::uint16_t minor = GENERATE(2, 3);
  INFO("ABI 1." << minor);
  proto::ClientHello hello = make_hello(proto::MessageKind::kClientQuery);
  hello.header.abi_minor = minor;
  hello.header.size = proto::kClientHelloSizeBeforeTokens;

  proto::Received answer = exchange(sut.socket_path(), &hello, proto::kClientHelloSizeBeforeTokens);

  auto header = daemon::header_of(answer);
  REQUIRE(header);
  CHECK(header->kind == static_cast<std::uint32_t>(proto::MessageKind::kDaemonDevices));
  // One byte shorter is not a hello: closed without an answer.
  proto::Received truncated =
      exchange(sut.socket_path(), &hello, proto::kClientHelloSizeBeforeTokens - 1);
  CHECK(truncated.bytes.empty());
}

TEST_CASE("a query applies CUDA_VISIBLE_DEVICES as CUDA does", "[query]") {
  DaemonUnderTest sut({.gpus = 3});

  CHECK(query(sut.socket_path(), "2,0").ordinals == std::vector{2, 0});
  CHECK(query(sut.socket_path(), "GPU-ab33,1").ordinals == std::vector{2, 1});
  CHECK(query(sut.socket_path(), "1,7,0").ordinals == std::vector{1});
  CHECK(query(sut.socket_path(), "0,MIG-ab111111,1").ordinals == std::vector{0});
  CHECK(query(sut.socket_path(), "GPU-ab,0").ordinals.empty());
}

TEST_CASE("an attach goes to the server of the GPU the client means", "[attach]") {
  DaemonUnderTest sut({.gpus = 3});

  CHECK(bounded(attach(sut.socket_path(), "", 1)) == admitted(1));
  CHECK(bounded(attach(sut.socket_path(), "2,1", 0)) == admitted(2));
  CHECK(bounded(attach(sut.socket_path(), "GPU-ab11", 0)) == admitted(0));

  proto::Refused refused = attach(sut.socket_path(), "2,1", 2);
  CHECK(refused.cuda_error == CUDA_ERROR_INVALID_DEVICE);
  CHECK(contains(bounded(refused), "device 2 does not exist"));
  CHECK(contains(sut.log(), "attached to GPU 2"));
}

TEST_CASE("a client of another ABI major version is refused with both versions named",
          "[protocol]") {
  DaemonUnderTest sut({.gpus = 1});
  proto::ClientHello hello = make_hello(MessageKind::kClientQuery);
  hello.header.abi_major = proto::kAbiMajor + 1;
  hello.header.abi_minor = 0;

  auto refused = daemon::decode<proto::Refused>(exchange(sut.socket_path(), hello));

  REQUIRE(refused);
  CHECK(refused->header.kind == static_cast<std::uint32_t>(MessageKind::kRefused));
  CHECK(refused->cuda_error == CUDA_ERROR_MPS_CONNECTION_FAILED);
  std::string expected = "client speaks mpsshim ABI " + std::to_string(proto::kAbiMajor + 1) +
                         ".0, this daemon speaks " + std::to_string(proto::kAbiMajor) + "." +
                         std::to_string(proto::kAbiMinor);
  CHECK(contains(daemon::bounded_string(refused->message), expected));
}

TEST_CASE("a peer that does not speak mpsshim is closed without an answer", "[protocol]") {
  DaemonUnderTest sut({.gpus = 1});
  proto::ClientHello hello = make_hello(MessageKind::kClientQuery);
  hello.header.magic = 0x12345678;

  CHECK(exchange(sut.socket_path(), hello).bytes.empty());
  CHECK(query(sut.socket_path(), "").ordinals == std::vector{0});  // the daemon is fine
}

TEST_CASE("a silent peer does not hold up anyone else", "[protocol]") {
  DaemonUnderTest sut({.gpus = 1});
  proto::UniqueFd silent(proto::connect_seqpacket(sut.socket_path()));
  REQUIRE(silent);

  auto start = Clock::now();
  CHECK(query(sut.socket_path(), "").ordinals == std::vector{0});
  CHECK(Clock::now() - start < 4s);  // well under the silent peer's 5 s deadline
}

namespace {

// The arguments a server was started with, from /proc.
std::vector<std::string> command_line(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  return args;
}

// A process's environment, from /proc: NAME -> value.
std::map<std::string, std::string> environment_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::map<std::string, std::string> env;
  for (std::string entry; std::getline(in, entry, '\0');) {
    const std::size_t equals = entry.find('=');
    if (equals != std::string::npos) env[entry.substr(0, equals)] = entry.substr(equals + 1);
  }
  return env;
}

bool has_pair(const std::vector<std::string>& args, const std::string& flag,
              const std::string& value) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag && args[i + 1] == value) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("--event-poll-us and --spin-clients reach every server", "[lifecycle]") {
  DaemonUnderTest sut({.gpus = 2, .args = {"--event-poll-us", "12", "--spin-clients", "3"}});
  for (const auto& [gpu, pid] : sut.server_pids()) {
    INFO("GPU " << gpu);
    CHECK(has_pair(command_line(pid), "--event-poll-us", "12"));
    CHECK(has_pair(command_line(pid), "--spin-clients", "3"));
  }
  DaemonUnderTest defaults({.gpus = 1});
  const std::vector<std::string> args = command_line(defaults.server_pids().at(0));
  CHECK(std::find(args.begin(), args.end(), "--event-poll-us") == args.end());
  CHECK(std::find(args.begin(), args.end(), "--spin-clients") == args.end());
}

TEST_CASE("the priority gate's options reach every server", "[lifecycle][priority]") {
  DaemonUnderTest sut(
      {.gpus = 2, .args = {"--priority-fence-poll-us", "7", "--priority-max-hold-us", "900"}});
  for (const auto& [gpu, pid] : sut.server_pids()) {
    INFO("GPU " << gpu);
    const std::vector<std::string> args = command_line(pid);
    CHECK(has_pair(args, "--priority-fence-poll-us", "7"));
    CHECK(has_pair(args, "--priority-max-hold-us", "900"));
  }
  DaemonUnderTest defaults({.gpus = 1});
  const std::vector<std::string> args = command_line(defaults.server_pids().at(0));
  CHECK_FALSE(has_pair(args, "--priority-fence-poll-us", "7"));  // the server's default
  CHECK(std::find(args.begin(), args.end(), "--priority-fence-poll-us") == args.end());
}

TEST_CASE("servers are NVIDIA MPS clients only with --nvidia-mps-pipe-directory",
          "[lifecycle][nvidia-mps]") {
  // The daemon's own CUDA_MPS_PIPE_DIRECTORY names mpsshimd's directory: a server's real driver
  // must not take it for an NVIDIA MPS daemon's.
  TempDir elsewhere;
  {
    DaemonUnderTest sut({.gpus = 1,
                         .env = {{"CUDA_MPS_PIPE_DIRECTORY", elsewhere.path()},
                                 {"CUDA_MPS_LOG_DIRECTORY", elsewhere.path()}}});
    const auto env = environment_of(sut.server_pids().at(0));
    REQUIRE_FALSE(env.empty());
    CHECK(env.count("CUDA_MPS_PIPE_DIRECTORY") == 0);
    CHECK(env.count("CUDA_MPS_LOG_DIRECTORY") == 0);
  }
  TempDir mps;
  REQUIRE(::mkfifo((mps.path() + "/control").c_str(), 0600) == 0);  // as nvidia-cuda-mps-control
  DaemonUnderTest sut({.gpus = 2, .args = {"--nvidia-mps-pipe-directory", mps.path()}});
  for (const auto& [gpu, pid] : sut.server_pids()) {
    INFO("GPU " << gpu);
    CHECK(environment_of(pid)["CUDA_MPS_PIPE_DIRECTORY"] == mps.path());
  }
  CHECK(contains(sut.log(), "run as a client of NVIDIA MPS in " + mps.path()));
}

TEST_CASE("--nvidia-mps-pipe-directory without an NVIDIA MPS daemon there is refused at start",
          "[lifecycle][nvidia-mps]") {
  TempDir run, empty;
  Outcome none =
      run_program({artefact("MPSSHIMD"), "--runtime-dir", run.path() + "/a", "--server",
                   artefact("FAKE_SERVER"), "--nvidia-mps-pipe-directory", empty.path()});
  CHECK(none.exit_code == 1);
  CHECK(contains(none.err, "no NVIDIA MPS control daemon there (" + empty.path() + "/control"));
  CHECK_FALSE(exists(run.path() + "/a/control"));

  Outcome own = run_program({artefact("MPSSHIMD"), "--runtime-dir", run.path(), "--server",
                             artefact("FAKE_SERVER"), "--nvidia-mps-pipe-directory", run.path()});
  CHECK(own.exit_code == 1);
  CHECK(contains(own.err, "is mpsshimd's own runtime directory"));

  Outcome relative = run_program({artefact("MPSSHIMD"), "--runtime-dir", run.path(), "--server",
                                  artefact("FAKE_SERVER"), "--nvidia-mps-pipe-directory", "mps"});
  CHECK(relative.exit_code != 0);
  CHECK(contains(relative.err, "--nvidia-mps-pipe-directory takes an absolute directory"));
}

TEST_CASE("a server that dies is restarted and clients are routed to the new one", "[restart]") {
  DaemonUnderTest sut({.gpus = 2});
  std::map<int, pid_t> before = sut.server_pids();
  REQUIRE(before.size() == 2);
  REQUIRE(before[1] > 0);

  ::kill(before[1], SIGKILL);

  REQUIRE(wait_until([&] {
    pid_t now = sut.server_pids()[1];
    return now > 0 && now != before[1];
  }));
  CHECK(sut.server_pids()[0] == before[0]);
  CHECK(sut.servers()[1].state == "running");
  CHECK(contains(sut.log(), "server for GPU 1 (pid " + std::to_string(before[1]) +
                                ") was killed by signal 9 (SIGKILL)"));
  CHECK(bounded(attach(sut.socket_path(), "", 1)) == admitted(1));
}

TEST_CASE("a server that exits with a GPU fault is logged as one and restarted", "[restart]") {
  DaemonUnderTest sut({.gpus = 1});
  pid_t before = sut.server_pids()[0];

  Outcome crash = sut.ctl({"server_command", "0", "crash"});

  CHECK(crash.exit_code == 1);
  CHECK(contains(crash.err, "exited with status 70 (GPU fault) before answering"));
  REQUIRE(wait_until([&] {
    pid_t now = sut.server_pids()[0];
    return now > 0 && now != before;
  }));
  CHECK(contains(sut.log(), "exited with status 70 (GPU fault)"));
  CHECK(contains(sut.log(), "; restarting in 0.1 s"));
  CHECK(sut.servers()[0].state == "running");
  CHECK(sut.servers()[0].restarts == 1);
}

TEST_CASE("a server that drops its control connection but lives on is replaced", "[restart]") {
  DaemonUnderTest sut({.gpus = 1});
  pid_t before = sut.server_pids()[0];

  Outcome hang_up = sut.ctl({"server_command", "0", "hang_up"});

  CHECK(hang_up.exit_code == 1);
  CHECK(contains(hang_up.err, "closed its control connection without answering"));
  REQUIRE(wait_until([&] {
    pid_t now = sut.server_pids()[0];
    return now > 0 && now != before;
  }));
  CHECK(process_gone(before));
  CHECK(contains(sut.log(), "closed its control connection but did not exit; killing it"));
  // The replacement takes clients once it reported ready (a loaded CI machine can take a while).
  REQUIRE(wait_until([&] { return sut.servers()[0].state == "running"; }));
  CHECK(bounded(attach(sut.socket_path(), "", 0)) == admitted(0));
}

TEST_CASE("a GPU whose server keeps failing is given up and the others still serve", "[restart]") {
  DaemonUnderTest sut(
      {.gpus = 2, .args = {"--restart-limit", "2"}, .env = {{"FAKE_SERVER_FAIL_DEVICE", "1"}}});

  std::string list = sut.ctl({"server_list"}).out;
  CHECK(sut.servers()[1].state == "failed");
  CHECK(sut.servers()[1].restarts == 1);
  CHECK(contains(list, "could not start: fake failure of GPU 1 (CUresult 100)"));
  CHECK(contains(sut.notify().received().back(), "GPU 1 failed"));
  CHECK(query(sut.socket_path(), "0").ordinals == std::vector{0});
  DeviceList all = query(sut.socket_path(), "");
  REQUIRE(all.refused);
  CHECK(all.refused->cuda_error == CUDA_ERROR_MPS_SERVER_NOT_READY);
  proto::Refused refused = attach(sut.socket_path(), "1", 0);
  CHECK(refused.cuda_error == CUDA_ERROR_MPS_SERVER_NOT_READY);
  CHECK(contains(bounded(refused), "the server for GPU 1 is failed"));
  CHECK(contains(sut.log(), "giving up on GPU 1"));
}

TEST_CASE("ps shows every server's clients", "[ps]") {
  DaemonUnderTest sut({.gpus = 2});

  Outcome ps = sut.ctl({"ps"});

  CHECK(ps.exit_code == 0);
  CHECK(contains(
      ps.out,
      "PID      USER        GPU  SMS      MEMORY      PEAK        LIMIT       PINNED      "
      "PARKED      LAUNCHES  BUSY      H2D         D2H         D2D         PRIO  STATE      "
      "STARTED"));
  CHECK(contains(ps.out, "STARTED              PROGRAM          ALLOCATION      ISOLATION\n"));
  CHECK(contains(ps.out, "\n4242     "));
  // What fake_server.cpp reports, for people.
  CHECK(contains(
      ps.out,
      "0    66       1.0 MiB     3.0 MiB     none        64.0 KiB    0 B         7         "
      "1.25s     4.0 KiB     2.0 KiB     1.0 KiB     1     active     "));
  // GPU 1's client is suspended, 1 MiB of it parked on the host.
  CHECK(contains(ps.out, "64.0 KiB    1.0 MiB     7         "));
  CHECK(contains(ps.out, " suspended  "));
  // GPU 1's client leaves 16 SMs of its 82 to normal-priority clients (--priority-reserve-sms).
  CHECK(contains(ps.out, "1    66/82    1.0 MiB"));
  // PROGRAM, then ALLOCATION: "-" for a client that does not belong to a pod's allocation;
  // then ISOLATION: the shared server's clients are "shared".
  CHECK(contains(ps.out, "fake-client-gpu0 -               shared\n"));
  CHECK(contains(ps.out, "fake-client-gpu1"));
  CHECK(contains(ps.out, "GPU 1: not a client line\n"));
}

TEST_CASE("ps --json gives every figure as a number", "[ps][json]") {
  DaemonUnderTest sut({.gpus = 2});

  Outcome ps = sut.ctl({"ps", "--json"});

  CHECK(ps.exit_code == 0);
  const nlohmann::json answer = nlohmann::json::parse(ps.out);
  CHECK(answer["ok"] == true);
  REQUIRE(answer["clients"].size() == 2);
  const nlohmann::json& c = answer["clients"][1];
  CHECK(c["gpu"] == 1);
  CHECK(c["client"] == 1);
  CHECK(c["pid"] == 4242);
  CHECK(c["uid"] == ::getuid());
  CHECK(c["user"] == own_user());
  CHECK(c["program"] == "fake-client-gpu1");
  CHECK(c["state"] == "suspended");
  CHECK(c["parked_bytes"] == 1048576);
  CHECK(c["suspended_us"] == 2500000);
  CHECK(c["start_time"] == 1795568665.25);
  CHECK(c["sms"] == 66);
  CHECK(c["sm_percentage"] == 50);
  CHECK(c["sms_held_back"] == 16);
  CHECK(c["priority"] == 1);
  CHECK(c["memory_used_bytes"] == 1048576);
  CHECK(c["memory_peak_bytes"] == 3145728);
  CHECK(c["memory_limit_bytes"].is_null());  // mem_limit=0: none
  CHECK(c["pinned_host_bytes"] == 65536);
  CHECK(c["launches"] == 7);
  CHECK(c["busy_us"] == 1250000);
  CHECK(c["copied_bytes"] == nlohmann::json{{"h2d", 4096}, {"d2h", 2048}, {"d2d", 1024}});
  CHECK(c["worker"] == 0);
  CHECK(answer["notes"] == nlohmann::json{"GPU 0: not a client line", "GPU 1: not a client line"});
}

TEST_CASE("every mpsshimctl command answers --json with one JSON object", "[ctl][json]") {
  DaemonUnderTest sut({.gpus = 2});

  // command, whether it succeeds; the keys its object must have besides "ok".
  struct Case {
    std::vector<std::string> command;
    bool ok;
    std::vector<std::string> keys;
  };
  const std::vector<Case> cases{
      {{"help"}, true, {"commands"}},
      {{"server_list"}, true, {"servers"}},
      {{"device_query"}, true, {"gpus"}},
      {{"ps"}, true, {"clients", "notes"}},
      {{"stats"}, true, {"clients", "notes"}},
      {{"terminate_client", "1", "4242"}, true, {"message"}},
      {{"set_default_active_thread_percentage", "40"}, true, {"message"}},
      {{"get_default_active_thread_percentage"}, true, {"value"}},
      {{"set_default_device_pinned_mem_limit", "0", "4G"}, true, {"message"}},
      {{"get_default_device_pinned_mem_limit", "0"}, true, {"gpu", "bytes"}},
      {{"set_active_thread_percentage", "0", "4242", "50"}, true, {"message"}},
      {{"set_device_pinned_mem_limit", "0", "4242", "1G"}, true, {"message"}},
      {{"suspend", "0", "4242"}, true, {"message"}},
      {{"resume", "0", "4242"}, true, {"message"}},
      {{"suspend", "0", "nobody"}, false, {"message"}},
      {{"server_command", "1", "hello"}, true, {"message"}},
      {{"gpu_states"}, true, {"gpus"}},
      {{"register_allocation", "sm=25", "memory=1G", "namespace=ns", "pod=p"},
       true,
       {"allocation", "token"}},
      {{"label_allocation", "1", "ns2", "p2"}, true, {"message"}},
      {{"list_allocations"}, true, {"allocations", "tokens_required"}},
      {{"revoke_allocation", "1"}, true, {"message"}},
      {{"revoke_allocation", "1"}, false, {"message"}},  // no longer there
      {{"sm_partition", "add", "0", "16"}, true, {"partition"}},
      {{"sm_partition", "add", "0", "100000"}, false, {"message"}},  // more than the GPU has
      {{"lspart"}, true, {"partitions"}},
      {{"sm_partition", "rm", "1"}, true, {"message"}},
      {{"sm_partition", "rm", "1"}, false, {"message"}},  // no longer there
      {{"set_active_thread_percentage", "0", "4242", "101"}, false, {"message"}},
      {{"frobnicate"}, false, {"message"}},
      {{"reload"}, false, {"message"}},  // started without --config
      {{"quit"}, true, {"message"}},     // last: it stops the daemon
  };
  // Every command `help` lists is among the cases.
  Outcome help = sut.ctl({"--json", "help"});
  INFO("help --json: " << help.out);
  const nlohmann::json listed = nlohmann::json::parse(help.out);
  for (const nlohmann::json& command : listed["commands"]) {
    const std::string name = command["name"].get<std::string>();
    INFO(name);
    CHECK(std::any_of(cases.begin(), cases.end(),
                      [&](const Case& c) { return c.command.front() == name; }));
  }
  for (const Case& c : cases) {
    std::vector<std::string> command = c.command;
    command.push_back("--json");
    Outcome o = sut.ctl(command);
    INFO(fmt::format("{}\nstdout: {}\nstderr: {}", fmt::join(command, " "), o.out, o.err));
    CHECK(o.exit_code == (c.ok ? 0 : 1));
    nlohmann::json answer;
    REQUIRE_NOTHROW(answer = nlohmann::json::parse(o.out));
    REQUIRE(answer.is_object());
    CHECK(answer["ok"] == c.ok);
    for (const std::string& key : c.keys) CHECK(answer.contains(key));
  }
}

TEST_CASE("--json answers carry the figures of the text answers", "[ctl][json]") {
  DaemonUnderTest sut({.gpus = 2});

  const nlohmann::json servers = nlohmann::json::parse(sut.ctl({"server_list", "--json"}).out);
  const nlohmann::json gpus = nlohmann::json::parse(sut.ctl({"device_query", "--json"}).out);
  const nlohmann::json limit =
      nlohmann::json::parse(sut.ctl({"get_default_device_pinned_mem_limit", "1", "--json"}).out);

  REQUIRE(servers["servers"].size() == 2);
  CHECK(servers["servers"][1]["gpu"] == 1);
  CHECK(servers["servers"][1]["state"] == "running");
  CHECK(servers["servers"][1]["pid"].is_number_integer());
  CHECK(servers["servers"][1]["restarts"] == 0);
  CHECK(servers["servers"][1]["details"] == "Fake GPU 1");
  REQUIRE(gpus["gpus"].size() == 2);
  CHECK(gpus["gpus"][1]["name"] == "Fake GPU 1");
  CHECK(gpus["gpus"][1]["uuid"] == "GPU-ab222222-2222-2222-2222-222222222222");
  CHECK(gpus["gpus"][1]["memory_bytes"] == 85899345920ull);
  CHECK(gpus["gpus"][1]["sms"] == 132);
  CHECK(gpus["gpus"][1]["driver_version"] == 13000);
  CHECK(limit == nlohmann::json{{"ok", true}, {"gpu", 1}, {"bytes", 0}});
}

TEST_CASE("ps lists 300 clients whole: long answers travel in parts on both hops", "[ps]") {
  DaemonUnderTest sut({.gpus = 1, .env = {{"FAKE_SERVER_CLIENTS", "300"}}});

  Outcome ps = sut.ctl({"ps"});

  CHECK(ps.exit_code == 0);
  CHECK(ps.out.size() > 2 * sizeof(proto::TextMessage{}.text));
  for (int i = 0; i < 300; ++i) {
    INFO("client " << i);
    REQUIRE(contains(ps.out, fmt::format("\n{}     ", 5000 + i)));
  }
  // The last columns: ALLOCATION, ISOLATION.
  CHECK(contains(ps.out, fmt::format("{:<17}{:<16}shared\n", "many-299", "-")));
  CHECK_FALSE(contains(ps.out, "cut"));
}

TEST_CASE("ps names the server that did not answer", "[ps]") {
  DaemonUnderTest sut({.gpus = 2, .env = {{"FAKE_SERVER_SILENT_DEVICE", "1"}}});

  Outcome ps = sut.ctl({"ps"});

  CHECK(ps.exit_code == 1);
  CHECK(contains(ps.err, "fake-client-gpu0"));
  CHECK(contains(ps.err, "GPU 1: the server for GPU 1 (pid "));
  CHECK(contains(ps.err, "did not answer within 2.0 s"));
  // The late answer never comes; a later request must still get its own answer.
  CHECK(sut.ctl({"terminate_client", "1", "4242"}).out == "fake server 1 terminated client 4242\n");
}

TEST_CASE("stats shows every server's per-client figures", "[stats]") {
  DaemonUnderTest sut({.gpus = 2});

  Outcome stats = sut.ctl({"stats"});

  CHECK(stats.exit_code == 0);
  CHECK(contains(stats.out,
                 "PID      USER        GPU  RECORDS    SERVER    DELAY_P50  DELAY_P99  DELAY_MAX  "
                 "BATCHED       IMAGES     PRIVATE    PROGRAM          TOP\n"));
  CHECK(contains(stats.out, "\n4242     "));
  CHECK(contains(stats.out,
                 "1    20512      55.1ms    0.4us      3.1us      8.2us      19200/64.0    "
                 "441/3      8.0 MiB    fake-client-gpu1 "
                 "LaunchKernel:20000:51.2ms,StreamSynchronize:12:3.1ms\n"));
  CHECK(contains(stats.out, "fake-client-gpu0"));
  CHECK(contains(stats.out, "GPU 0: not a client line\n"));
}

TEST_CASE("stats --json gives the same figures as numbers", "[stats][json]") {
  DaemonUnderTest sut({.gpus = 1});

  Outcome json = sut.ctl({"stats", "--json"});
  Outcome wrong = sut.ctl({"stats", "--xml"});

  CHECK(json.exit_code == 0);
  const nlohmann::json answer = nlohmann::json::parse(json.out);
  REQUIRE(answer["clients"].size() == 1);
  const nlohmann::json expected = {
      {"gpu", 0},
      {"client", 1},
      {"pid", 4242},
      {"uid", ::getuid()},
      {"user", own_user()},
      {"program", "fake-client-gpu0"},
      {"records", 20512},
      {"server_us", 55123},
      {"delay_samples", 20512},
      {"delay_p50_us", 0.4},
      {"delay_p99_us", 3.1},
      {"delay_max_us", 8.2},
      {"worker", 0},
      {"batches", 300},
      {"batched", 19200},
      {"fence_watches", 12},
      {"watch_wakes", 9},
      {"dozes", 7},
      {"images_shared", 441},
      {"images_shared_bytes", 289931264},
      {"images_private", 3},
      {"images_private_bytes", 8388608},
      {"top",
       {{{"op", "LaunchKernel"}, {"count", 20000}, {"server_us", 51234}},
        {{"op", "StreamSynchronize"}, {"count", 12}, {"server_us", 3100}}}},
  };
  CHECK(answer["clients"][0] == expected);
  CHECK(answer["notes"] == nlohmann::json{"GPU 0: not a client line"});
  CHECK(answer["ok"] == true);
  CHECK(wrong.exit_code == 1);
  CHECK(contains(wrong.err, "usage: stats [--json]"));
}

TEST_CASE("stats names the server that did not answer", "[stats]") {
  DaemonUnderTest sut({.gpus = 2, .env = {{"FAKE_SERVER_SILENT_DEVICE", "1"}}});

  Outcome stats = sut.ctl({"stats"});

  CHECK(stats.exit_code == 1);
  CHECK(contains(stats.err, "fake-client-gpu0"));
  CHECK(contains(stats.err, "GPU 1: the server for GPU 1 (pid "));
}

TEST_CASE("operator commands answer, and mpsshimctl's exit status says how it went", "[ctl]") {
  DaemonUnderTest sut({.gpus = 2});

  Outcome help = sut.ctl({"help"});
  CHECK(help.exit_code == 0);
  CHECK(contains(help.out, "terminate_client <gpu> <pid>"));

  Outcome unknown = sut.ctl({"frobnicate"});
  CHECK(unknown.exit_code == 1);
  CHECK(contains(unknown.err, "unknown command `frobnicate`; `help` lists the commands"));

  Outcome terminate = sut.ctl({"terminate_client", "1", "4242"});
  CHECK(terminate.exit_code == 0);
  CHECK(terminate.out == "fake server 1 terminated client 4242\n");
  CHECK(sut.ctl({"terminate_client", "7", "4242"}).exit_code == 1);
  CHECK(sut.ctl({"terminate_client", "0"}).err == "usage: terminate_client <gpu> <pid> [--json]\n");

  Outcome query_text = sut.ctl({"device_query"});
  CHECK(query_text.exit_code == 0);
  CHECK(contains(query_text.out, "GPU 1: Fake GPU 1"));
  CHECK(contains(query_text.out, "GPU-ab222222-2222-2222-2222-222222222222"));
  CHECK(contains(query_text.out, "80.0 GiB"));
  CHECK(contains(query_text.out, "driver:  13.0 (13000)"));

  Outcome piped = sut.ctl({}, "server_list\n\nfrobnicate\n");
  CHECK(piped.exit_code == 1);
  CHECK(contains(piped.out, "RESTARTS"));
  CHECK(contains(piped.err, "unknown command"));
}

TEST_CASE("mpsshimctl says where it looked when no daemon answers", "[ctl]") {
  TempDir nowhere;

  Outcome outcome =
      run_program({artefact("MPSSHIMCTL"), "--runtime-dir", nowhere.path(), "server_list"});

  CHECK(outcome.exit_code == 2);
  CHECK(contains(outcome.err, nowhere.path() + "/control"));
  CHECK(contains(outcome.err, "mpsshimd -d"));
}

TEST_CASE("default quotas reach running servers and restarted ones", "[ctl]") {
  DaemonUnderTest sut({.gpus = 2});

  CHECK(sut.ctl({"get_default_active_thread_percentage"}).out == "100\n");
  CHECK(sut.ctl({"set_default_active_thread_percentage", "25"}).exit_code == 0);
  CHECK(sut.ctl({"set_default_active_thread_percentage", "250"}).exit_code == 1);
  CHECK(sut.ctl({"get_default_active_thread_percentage"}).out == "25\n");
  CHECK(sut.ctl({"set_default_device_pinned_mem_limit", "1", "4G"}).exit_code == 0);
  CHECK(sut.ctl({"get_default_device_pinned_mem_limit", "1"}).out == "4G\n");
  CHECK(sut.ctl({"get_default_device_pinned_mem_limit", "0"}).out == "0\n");

  std::string running = sut.ctl({"server_command", "1", "show_state"}).out;
  CHECK(contains(running,
                 "taken: set_default_active_thread_percentage 25; "
                 "set_default_memory_limit 4294967296"));

  pid_t before = sut.server_pids()[1];
  ::kill(before, SIGKILL);
  REQUIRE(wait_until([&] {
    pid_t now = sut.server_pids()[1];
    return now > 0 && now != before;
  }));
  // The new server answers once it has started: ask until it does (a loaded machine is slow).
  std::string restarted;
  CHECK(wait_until([&] {
    restarted = sut.ctl({"server_command", "1", "show_state"}).out;
    return contains(restarted, "--default-sm-percentage");
  }));
  CHECK(contains(restarted, "--default-sm-percentage 25"));
  CHECK(contains(restarted, "--default-memory-limit 4294967296"));
  CHECK_FALSE(contains(sut.ctl({"server_command", "0", "show_state"}).out, "--default-memory"));
}

TEST_CASE("SIGTERM stops the servers, removes the socket and pid file, and exits 0",
          "[lifecycle]") {
  DaemonUnderTest sut({.gpus = 2});
  std::map<int, pid_t> servers = sut.server_pids();
  REQUIRE(exists(sut.socket_path()));
  REQUIRE(exists(sut.pid_file()));

  CHECK(sut.stop(SIGTERM) == 0);

  CHECK_FALSE(exists(sut.socket_path()));
  CHECK_FALSE(exists(sut.pid_file()));
  for (auto [gpu, pid] : servers) CHECK(wait_until([pid = pid] { return process_gone(pid); }));
  CHECK(sut.notify().wait_for("STOPPING=1"));
}

TEST_CASE("quit stops the daemon the same way", "[lifecycle]") {
  DaemonUnderTest sut({.gpus = 1});
  pid_t server = sut.server_pids()[0];

  Outcome quit = sut.ctl({"quit"});

  CHECK(quit.exit_code == 0);
  CHECK(contains(quit.out, "is stopping"));
  CHECK(sut.wait_exit() == 0);
  CHECK(process_gone(server));
  CHECK_FALSE(exists(sut.socket_path()));
}

TEST_CASE("a server that does not stop is killed after --stop-timeout", "[lifecycle]") {
  DaemonUnderTest sut(
      {.gpus = 1, .args = {"--stop-timeout", "1"}, .env = {{"FAKE_SERVER_HANG_ON_STOP", "1"}}});
  pid_t server = sut.server_pids()[0];

  CHECK(sut.stop(SIGTERM) == 0);

  CHECK(wait_until([&] { return process_gone(server); }));
  CHECK(contains(sut.log(), "did not stop within 1.0 s; killing it"));
}

TEST_CASE("a second daemon on the same directory is refused; a stale socket is replaced",
          "[lifecycle]") {
  DaemonUnderTest first({.gpus = 1});

  Outcome second = run_program({artefact("MPSSHIMD"), "--runtime-dir", first.runtime_dir(),
                                "--server", artefact("FAKE_SERVER")});
  CHECK(second.exit_code == 1);
  CHECK(contains(second.err, "another mpsshimd (pid " + std::to_string(first.pid()) + ")"));
  CHECK(query(first.socket_path(), "").ordinals == std::vector{0});  // untouched
  REQUIRE(first.stop(SIGKILL));  // leaves its socket and pid file behind, as a crash would

  REQUIRE(exists(first.socket_path()));
  DaemonUnderTest again({.gpus = 1, .args = {"--runtime-dir", first.runtime_dir()}});
  CHECK(query(first.socket_path(), "").ordinals == std::vector{0});
}

TEST_CASE("the runtime directory comes from CUDA_MPS_PIPE_DIRECTORY without --runtime-dir",
          "[runtime-dir]") {
  DaemonUnderTest sut({.gpus = 1, .runtime_dir_from_env = true});

  CHECK(exists(sut.socket_path()));
  struct stat st {};
  REQUIRE(::stat(sut.runtime_dir().c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  Outcome found = run_program({artefact("MPSSHIMCTL"), "server_list"},
                              {{"CUDA_MPS_PIPE_DIRECTORY", sut.runtime_dir()}});
  CHECK(found.exit_code == 0);
  CHECK(contains(found.out, "running"));
}

TEST_CASE("--runtime-dir wins over CUDA_MPS_PIPE_DIRECTORY", "[runtime-dir]") {
  TempDir elsewhere;
  DaemonUnderTest sut({.gpus = 1, .env = {{"CUDA_MPS_PIPE_DIRECTORY", elsewhere.path()}}});

  CHECK(exists(sut.socket_path()));
  CHECK_FALSE(exists(elsewhere.path() + "/control"));
}

TEST_CASE("READY=1 reaches an abstract NOTIFY_SOCKET too", "[runtime-dir]") {
  DaemonUnderTest sut({.gpus = 2, .abstract_notify_socket = true});  // waits for READY=1

  CHECK(contains(sut.notify().received().back(), "STATUS=2 of 2 GPU servers running"));
}

TEST_CASE("-d returns once the daemon is ready and leaves it running", "[lifecycle]") {
  TempDir tmp;
  std::string dir = tmp.path() + "/run";

  Outcome started = run_program(
      {artefact("MPSSHIMD"), "-d", "--runtime-dir", dir, "--server", artefact("FAKE_SERVER")},
      {{"FAKE_SERVER_DEVICES", "2"}});

  REQUIRE(started.exit_code == 0);
  std::ifstream pid_file(dir + "/mpsshimd.pid");
  pid_t pid = 0;
  pid_file >> pid;
  REQUIRE(pid > 0);
  CHECK_FALSE(process_gone(pid));
  CHECK(contains(started.out, "running in the background as pid " + std::to_string(pid)));
  Outcome list = run_program({artefact("MPSSHIMCTL"), "--runtime-dir", dir, "server_list"});
  CHECK(contains(list.out, "running"));
  CHECK(run_program({artefact("MPSSHIMCTL"), "--runtime-dir", dir, "quit"}).exit_code == 0);
  CHECK(wait_until([&] { return process_gone(pid); }));
  CHECK_FALSE(exists(dir + "/control"));
}

TEST_CASE("quit then -d at once restarts: the new daemon waits for the stopping one to exit",
          "[lifecycle]") {
  TempDir tmp;
  std::string dir = tmp.path() + "/run";
  // The first daemon's server ignores SIGTERM, so that daemon stops only after its
  // --stop-timeout: long after `quit` has answered and its socket is gone.
  auto start = [&](const std::map<std::string, std::string>& env) {
    return run_program({artefact("MPSSHIMD"), "-d", "--runtime-dir", dir, "--server",
                        artefact("FAKE_SERVER"), "--stop-timeout", "2"},
                       env);
  };
  Outcome first = start({{"FAKE_SERVER_DEVICES", "1"}, {"FAKE_SERVER_HANG_ON_STOP", "1"}});
  REQUIRE(first.exit_code == 0);
  std::ifstream first_pid_file(dir + "/mpsshimd.pid");
  pid_t first_pid = 0;
  first_pid_file >> first_pid;
  REQUIRE(first_pid > 0);

  REQUIRE(run_program({artefact("MPSSHIMCTL"), "--runtime-dir", dir, "quit"}).exit_code == 0);
  REQUIRE_FALSE(process_gone(first_pid));  // still ending its server
  Outcome second = start({{"FAKE_SERVER_DEVICES", "1"}});

  INFO(second.out << second.err);
  CHECK(second.exit_code == 0);
  CHECK(process_gone(first_pid));
  Outcome list = run_program({artefact("MPSSHIMCTL"), "--runtime-dir", dir, "server_list"});
  CHECK(contains(list.out, "running"));
  CHECK(run_program({artefact("MPSSHIMCTL"), "--runtime-dir", dir, "quit"}).exit_code == 0);
}

TEST_CASE(
    "-d exits 1 with the reason when a GPU's server does not come up; the daemon serves "
    "the others",
    "[lifecycle]") {
  TempDir tmp;
  std::string dir = tmp.path() + "/run";

  Outcome started = run_program(
      {artefact("MPSSHIMD"), "-d", "--runtime-dir", dir, "--server", artefact("FAKE_SERVER")},
      {{"FAKE_SERVER_DEVICES", "2"}, {"FAKE_SERVER_FAIL_DEVICE", "1"}});

  CHECK(started.exit_code == 1);
  CHECK(contains(started.err,
                 "not every GPU's server came up: 1 of 2 GPU servers running, "
                 "GPU 1 failed"));
  std::ifstream pid_file(dir + "/mpsshimd.pid");
  pid_t pid = 0;
  pid_file >> pid;
  REQUIRE(pid > 0);
  CHECK_FALSE(process_gone(pid));
  CHECK(run_program({artefact("MPSSHIMCTL"), "--runtime-dir", dir, "quit"}).exit_code == 0);
  CHECK(wait_until([&] { return process_gone(pid); }));
}

// --metrics-listen: a real TCP connection to the daemon's /metrics.
namespace {

struct HttpReply {
  int status = 0;  // 0: no answer
  std::string head;
  std::string body;
};

// A TCP connection to 127.0.0.1:`port` whose reads and writes give up after `timeout`.
proto::UniqueFd connect_tcp(int port, std::chrono::seconds timeout = 10s) {
  proto::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval limit{static_cast<time_t>(timeout.count()), 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return {};
  return fd;
}

// Everything the peer sends until it closes (or the read times out).
std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) {
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return text;
}

HttpReply http(int port, const std::string& request) {
  proto::UniqueFd fd = connect_tcp(port);
  if (!fd) return {};
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return {};
  }
  std::string text = read_all(fd.get());
  HttpReply reply;
  std::size_t end = text.find("\r\n\r\n");
  if (end == std::string::npos || !text.starts_with("HTTP/1.1 ")) return reply;
  reply.status = std::atoi(text.c_str() + 9);
  reply.head = text.substr(0, end + 2);
  reply.body = text.substr(end + 4);
  return reply;
}

HttpReply get(int port, const std::string& path) {
  return http(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n");
}

// The port the daemon bound for --metrics-listen 127.0.0.1:0, from its log line.
int metrics_port(const DaemonUnderTest& sut) {
  const std::string marker = "metrics: listening on 127.0.0.1:";
  int port = 0;
  wait_until([&] {
    std::string log = sut.log();
    std::size_t at = log.find(marker);
    if (at == std::string::npos) return false;
    port = std::atoi(log.c_str() + at + marker.size());
    return port > 0;
  });
  return port;
}

DaemonConfig with_metrics(DaemonConfig config) {
  config.args.insert(config.args.end(), {"--metrics-listen", "127.0.0.1:0"});
  return config;
}

// promtool from the PATH or /usr/bin; empty when Prometheus is not installed.
std::string find_promtool() {
  std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/local/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string candidate = path.substr(start, end - start) + "/promtool";
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

}  // namespace

TEST_CASE("GET /metrics reports every GPU's server and every client's figures", "[metrics]") {
  DaemonUnderTest sut(with_metrics({.gpus = 2}));
  int port = metrics_port(sut);
  REQUIRE(port > 0);

  HttpReply reply = get(port, "/metrics");

  REQUIRE(reply.status == 200);
  CHECK(contains(reply.head, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  CHECK(contains(reply.head, "\r\nConnection: close\r\n"));
  CHECK(contains(reply.head, fmt::format("\r\nContent-Length: {}\r\n", reply.body.size())));
  const std::string& m = reply.body;
  for (const char* family : {"mpsshim_server_up", "mpsshim_server_restarts_total",
                             "mpsshim_client_launches_total", "mpsshim_client_records_total"}) {
    INFO(family);
    CHECK(contains(m, fmt::format("# HELP {} ", family)));
    CHECK(contains(m, fmt::format("# TYPE {} ", family)));
  }
  CHECK(contains(m, "# TYPE mpsshim_client_launches_total counter\n"));
  CHECK(contains(m, "mpsshim_server_up{gpu=\"0\"} 1\nmpsshim_server_up{gpu=\"1\"} 1\n"));
  CHECK(contains(m, "mpsshim_server_restarts_total{gpu=\"1\"} 0\n"));
  CHECK(contains(m, "mpsshim_server_clients{gpu=\"1\"} 1\n"));
  CHECK(contains(m, "mpsshim_gpu_sms{gpu=\"1\"} 132\n"));
  CHECK(contains(m, "mpsshim_gpu_memory_bytes{gpu=\"1\"} 85899345920\n"));
  CHECK(
      contains(m,
               "mpsshim_gpu_info{gpu=\"1\",name=\"Fake GPU 1\","
               "uuid=\"GPU-ab222222-2222-2222-2222-222222222222\",driver_version=\"13000\"} 1\n"));
  CHECK(contains(m, "mpsshim_build_info{version=\""));
  CHECK(contains(m, "mpsshim_daemon_start_time_seconds 1"));
  // What the fake server of GPU 1 reports for its client (fake_server.cpp), from `ps` ...
  const std::string client = fmt::format(
      "{{gpu=\"1\",client=\"1\",pid=\"4242\",user=\"{}\",program=\"fake-client-gpu1\"}}",
      own_user());
  CHECK(contains(m, "mpsshim_client_launches_total" + client + " 7\n"));
  CHECK(contains(m, "mpsshim_client_memory_used_bytes" + client + " 1048576\n"));
  CHECK(contains(m, "mpsshim_client_sms" + client + " 66\n"));
  CHECK(contains(m, "mpsshim_client_sms_held_back" + client + " 16\n"));
  CHECK(contains(m, "mpsshim_client_memory_peak_bytes" + client + " 3145728\n"));
  CHECK(contains(m, "mpsshim_client_pinned_host_memory_bytes" + client + " 65536\n"));
  // GPU 1's fake client is suspended (fake_server.cpp).
  CHECK(contains(m, "mpsshim_client_suspended" + client + " 1\n"));
  CHECK(contains(m, "mpsshim_client_parked_bytes" + client + " 1048576\n"));
  CHECK(contains(m, "mpsshim_client_suspended_seconds_total" + client + " 2.5\n"));
  CHECK(contains(m, "mpsshim_client_busy_seconds_total" + client + " 1.25\n"));
  CHECK(contains(m, "mpsshim_client_start_time_seconds" + client + " 1795568665.25\n"));
  const std::string copied = client.substr(0, client.size() - 1);
  CHECK(contains(m, "mpsshim_client_copied_bytes_total" + copied + ",direction=\"h2d\"} 4096\n"));
  CHECK(contains(m, "mpsshim_client_copied_bytes_total" + copied + ",direction=\"d2h\"} 2048\n"));
  CHECK(contains(m, "mpsshim_client_copied_bytes_total" + copied + ",direction=\"d2d\"} 1024\n"));
  CHECK_FALSE(contains(m, "mpsshim_client_memory_limit_bytes{"));  // mem_limit=0: unlimited
  // ... and from `stats`.
  CHECK(contains(m, "mpsshim_client_records_total" + client + " 20512\n"));
  CHECK(contains(m, "mpsshim_client_server_seconds_total" + client + " 0.055123\n"));
  CHECK(contains(m, "mpsshim_client_launches_batched_total" + client + " 19200\n"));
  CHECK(contains(m, "mpsshim_client_graph_launches_total" + client + " 300\n"));
  CHECK(contains(m, "mpsshim_client_images_loaded_total" + copied + ",sharing=\"shared\"} 441\n"));
  CHECK(contains(m, "mpsshim_client_images_loaded_total" + copied + ",sharing=\"private\"} 3\n"));
  CHECK(contains(
      m, "mpsshim_client_image_bytes_loaded_total" + copied + ",sharing=\"shared\"} 289931264\n"));
  CHECK(contains(
      m, "mpsshim_client_image_bytes_loaded_total" + copied + ",sharing=\"private\"} 8388608\n"));
  CHECK(contains(m, "program=\"fake-client-gpu0\""));

  HttpReply other = get(port, "/");
  CHECK(other.status == 404);
  CHECK(get(port, "/metrics/x").status == 404);
  CHECK(http(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status == 405);
  CHECK(http(port, "nonsense\r\n\r\n").status == 400);
  HttpReply head = http(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(head.status == 200);
  CHECK(head.body.empty());
  // The daemon still serves its control socket.
  CHECK(sut.ctl({"ps"}).exit_code == 0);
}

TEST_CASE("promtool check metrics accepts the scrape", "[metrics]") {
  DaemonUnderTest sut(with_metrics({.gpus = 2, .env = {{"FAKE_SERVER_CLIENTS", "20"}}}));
  int port = metrics_port(sut);
  REQUIRE(port > 0);
  HttpReply reply = get(port, "/metrics");
  REQUIRE(reply.status == 200);
  CHECK(contains(reply.body, "program=\"many-19\""));

  std::string promtool = find_promtool();
  if (promtool.empty()) {
    WARN(
        "SKIPPED: promtool not found (install the `prometheus` package); the scrape was not "
        "validated by it");
    return;
  }
  Outcome check = run_program({promtool, "check", "metrics"}, {}, reply.body);
  INFO("promtool stdout: " << check.out << "\nstderr: " << check.err);
  CHECK(check.exit_code == 0);
}

TEST_CASE("a scraper that sends nothing holds up no other scrape and is closed", "[metrics]") {
  DaemonUnderTest sut(with_metrics({.gpus = 1}));
  int port = metrics_port(sut);
  REQUIRE(port > 0);

  proto::UniqueFd silent = connect_tcp(port, 20s);
  REQUIRE(silent);
  proto::UniqueFd partial = connect_tcp(port, 20s);
  REQUIRE(partial);
  ::send(partial.get(), "GET /metr", 9, MSG_NOSIGNAL);

  auto start = Clock::now();
  HttpReply reply = get(port, "/metrics");
  CHECK(reply.status == 200);
  CHECK(Clock::now() - start < 3s);
  CHECK(sut.ctl({"server_list"}).exit_code == 0);

  // The silent ones are closed after the daemon's request timeout (5 s), without an answer.
  start = Clock::now();
  CHECK(read_all(silent.get()).empty());
  CHECK(read_all(partial.get()).empty());
  CHECK(Clock::now() - start < 15s);
}

TEST_CASE("a server that does not answer leaves its clients out of the scrape", "[metrics]") {
  DaemonUnderTest sut(with_metrics({.gpus = 2, .env = {{"FAKE_SERVER_SILENT_DEVICE", "1"}}}));
  int port = metrics_port(sut);
  REQUIRE(port > 0);

  HttpReply reply = get(port, "/metrics");

  REQUIRE(reply.status == 200);
  CHECK(contains(reply.body, "mpsshim_server_scrape_answered{gpu=\"0\"} 1\n"));
  CHECK(contains(reply.body, "mpsshim_server_scrape_answered{gpu=\"1\"} 0\n"));
  CHECK(contains(reply.body, "program=\"fake-client-gpu0\"} 7\n"));
  CHECK_FALSE(contains(reply.body, "fake-client-gpu1"));
}

TEST_CASE("a GPU fault counts in mpsshim_server_gpu_faults_total", "[metrics]") {
  DaemonUnderTest sut(with_metrics({.gpus = 1}));
  int port = metrics_port(sut);
  REQUIRE(port > 0);
  CHECK(contains(get(port, "/metrics").body, "mpsshim_server_gpu_faults_total{gpu=\"0\"} 0\n"));

  sut.ctl({"server_command", "0", "crash"});
  REQUIRE(wait_until([&] {
    auto servers = sut.servers();
    return servers[0].restarts == 1 && servers[0].state == "running";
  }));

  std::string body = get(port, "/metrics").body;
  CHECK(contains(body, "mpsshim_server_gpu_faults_total{gpu=\"0\"} 1\n"));
  CHECK(contains(body, "mpsshim_server_restarts_total{gpu=\"0\"} 1\n"));
  CHECK(contains(body, "mpsshim_server_up{gpu=\"0\"} 1\n"));
}

TEST_CASE("--metrics-listen on a port in use is a startup failure", "[metrics]") {
  DaemonUnderTest first(with_metrics({.gpus = 1}));
  int port = metrics_port(first);
  REQUIRE(port > 0);
  TempDir tmp;
  Outcome second =
      run_program({artefact("MPSSHIMD"), "--runtime-dir", tmp.path() + "/run", "--server",
                   artefact("FAKE_SERVER"), "--metrics-listen", std::to_string(port)});
  CHECK(second.exit_code == 1);
  CHECK(contains(second.err, fmt::format("cannot listen for metrics on 127.0.0.1:{}", port)));
  Outcome bad = run_program({artefact("MPSSHIMD"), "--metrics-listen", "localhost:9400"});
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.err, "--metrics-listen `localhost:9400`"));
}

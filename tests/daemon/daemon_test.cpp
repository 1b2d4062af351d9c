// mpsshimd as a whole: a real daemon process, fake per-GPU servers, real sockets, mpsshimctl.
#include <cuda.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>

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
  CHECK(contains(ps.out, "PID      USER        GPU  SMS   MEMORY      LIMIT       LAUNCHES"));
  CHECK(contains(ps.out, "\n4242     "));
  CHECK(contains(ps.out,
                 "0    66    1.0 MiB     none        7         active    fake-client-gpu0\n"));
  CHECK(contains(ps.out, "fake-client-gpu1"));
  CHECK(contains(ps.out, "GPU 1: not a client line\n"));
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
  CHECK(contains(ps.out, "many-299\n"));
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
                 "BATCHED       PROGRAM          TOP\n"));
  CHECK(contains(stats.out, "\n4242     "));
  CHECK(contains(stats.out,
                 "1    20512      55.1ms    0.4us      3.1us      8.2us      19200/64.0    "
                 "fake-client-gpu1 LaunchKernel:20000:51.2ms,StreamSynchronize:12:3.1ms\n"));
  CHECK(contains(stats.out, "fake-client-gpu0"));
  CHECK(contains(stats.out, "GPU 0: not a client line\n"));
}

TEST_CASE("stats --json gives the same figures as numbers", "[stats]") {
  DaemonUnderTest sut({.gpus = 1});

  Outcome json = sut.ctl({"stats", "--json"});
  Outcome wrong = sut.ctl({"stats", "--xml"});

  CHECK(json.exit_code == 0);
  CHECK(contains(json.out, R"({"clients": [{"gpu": 0, "client": 1, "pid": 4242, )"));
  CHECK(contains(json.out, R"("program": "fake-client-gpu0", "records": 20512, )"
                           R"("server_us": 55123, "delay_samples": 20512, "delay_p50_us": 0.4, )"
                           R"("delay_p99_us": 3.1, "delay_max_us": 8.2, "worker": 0, )"
                           R"("batches": 300, "batched": 19200, )"
                           R"("top": [{"op": "LaunchKernel", "count": 20000, "server_us": 51234}, )"
                           R"({"op": "StreamSynchronize", "count": 12, "server_us": 3100}]}])"));
  CHECK(contains(json.out, R"("notes": ["GPU 0: not a client line"]})"));
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
  CHECK(sut.ctl({"terminate_client", "0"}).err == "usage: terminate_client <gpu> <pid>\n");

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
  std::string restarted = sut.ctl({"server_command", "1", "show_state"}).out;
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

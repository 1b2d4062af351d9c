// Real processes and real sockets for the daemon tests: mpsshimd started with the fake server,
// mpsshimctl run as a child, and a client that speaks the socket protocol by hand.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Generous: CI machines are small and busy.
inline constexpr auto kPatience = 20s;

// Polls `condition` until it holds or `timeout` passes.
bool wait_until(const std::function<bool()>& condition, Clock::duration timeout = kPatience);

// Path of a built program named by an environment variable (set by meson).
std::string artefact(const char* variable);

struct Outcome {
  int exit_code = -1;  // negative: killed by that signal
  std::string out;
  std::string err;
};

// Runs a program to completion, stdin from `input`, capturing stdout and stderr.
Outcome run_program(const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env = {},
                    const std::string& input = "");

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The systemd side of sd_notify: a datagram socket at a path or, with a leading '@', in the
// abstract namespace.
class NotifySocket {
 public:
  explicit NotifySocket(std::string name);
  const std::string& name() const { return name_; }
  // Reads datagrams until one contains `needle`.
  bool wait_for(const std::string& needle, Clock::duration timeout = kPatience);
  const std::vector<std::string>& received() const { return received_; }

 private:
  std::string name_;
  proto::UniqueFd fd_;
  std::vector<std::string> received_;
};

struct DaemonConfig {
  int gpus = 2;
  std::vector<std::string> args{};           // added to the defaults below
  std::map<std::string, std::string> env{};  // FAKE_SERVER_* and friends
  bool runtime_dir_from_env = false;         // CUDA_MPS_PIPE_DIRECTORY instead of the option
  bool abstract_notify_socket = false;
  bool wait_ready = true;
};

// mpsshimd --runtime-dir <tmp>/run --server fake_server --log-file <tmp>/daemon.log, with
// NOTIFY_SOCKET set; constructed once READY=1 has arrived.
class DaemonUnderTest {
 public:
  explicit DaemonUnderTest(DaemonConfig config = {});
  ~DaemonUnderTest();
  DaemonUnderTest(const DaemonUnderTest&) = delete;
  DaemonUnderTest& operator=(const DaemonUnderTest&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& base() const { return tmp_.path(); }
  const std::string& runtime_dir() const { return runtime_dir_; }
  std::string socket_path() const { return runtime_dir_ + "/control"; }
  std::string pid_file() const { return runtime_dir_ + "/mpsshimd.pid"; }
  NotifySocket& notify() { return notify_; }
  std::string log() const;

  Outcome ctl(const std::vector<std::string>& args, const std::string& input = "") const;
  struct ServerRow {
    pid_t pid = 0;  // 0 when the GPU has no server process
    std::string state;
    int restarts = 0;
  };
  // By GPU, from `mpsshimctl server_list`.
  std::map<int, ServerRow> servers() const;
  std::map<int, pid_t> server_pids() const;
  // Sends `signal` and waits for the daemon; its exit status, or nullopt if it did not exit.
  std::optional<int> stop(int signal = SIGTERM, Clock::duration timeout = kPatience);
  std::optional<int> wait_exit(Clock::duration timeout = kPatience);

 private:
  TempDir tmp_;
  std::string runtime_dir_;
  NotifySocket notify_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

bool process_gone(pid_t pid);

// A client of the socket protocol, written by hand.
proto::ClientHello make_hello(proto::MessageKind kind, const std::string& visible_devices = "",
                              int device = 0);

// Connects, sends `bytes`, returns the one answer (empty bytes: the daemon closed).
proto::Received exchange(const std::string& socket_path, const void* bytes, std::size_t size);

template <typename T>
proto::Received exchange(const std::string& socket_path, const T& message) {
  return exchange(socket_path, &message, sizeof message);
}

struct DeviceList {
  std::vector<int> ordinals;  // physical ordinals, in the order the daemon sent them
  std::optional<proto::Refused> refused;
};
DeviceList query(const std::string& socket_path, const std::string& visible_devices);

// The fake server's admission text, or the real refusal.
proto::Refused attach(const std::string& socket_path, const std::string& visible_devices,
                      int device);

}  // namespace mpsshim::daemon_test

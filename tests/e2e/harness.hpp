// Real processes for the end-to-end tests: a daemon in a private runtime directory serving the
// host-memory test driver, and clients run under LD_PRELOAD=libmpsshim.so.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace mpsshim::e2e {

// Paths of the built artefacts, from the environment meson sets for the test.
std::string artefact(const char* variable);

// LD_PRELOAD for a client: libmpsshim.so, after the sanitizer runtime that must be loaded first
// in an ASan build ($SANITIZER_PRELOAD, set by meson; docs/testing.md).
std::string shim_preload();

struct Outcome {
  int exit_code = -1;  // -signal when killed by a signal
  std::string out;
  std::string err;
};

// A child process with captured stdout/stderr; with `stdin_pipe`, its stdin is a pipe the test
// closes (close_stdin) to tell it something (the e2e client's stress mode reads EOF as "go" or
// "stop").
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
        bool stdin_pipe = false);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits until stdout contains `text`; false on timeout or exit.
  bool wait_for_output(const std::string& text, std::chrono::seconds timeout);
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  void kill(int signal);
  void close_stdin();
  Outcome wait(std::chrono::seconds timeout = std::chrono::seconds(60));

 private:
  void pump(int timeout_ms);
  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
  bool reaped_ = false;
  Outcome outcome_;
};

class Daemon {
 public:
  // `env`: added to the daemon's environment (its servers and their driver inherit it). Its
  // servers' test driver answers driver_objects() (MPSSHIM_TESTDRIVER_QUERY_SOCKET).
  explicit Daemon(std::vector<std::string> extra_args = {},
                  std::map<std::string, std::string> env = {});
  ~Daemon();
  const std::string& dir() const { return dir_; }
  // The environment a client of this daemon runs with.
  std::map<std::string, std::string> client_env(
      std::map<std::string, std::string> extra = {}) const;
  Outcome ctl(const std::vector<std::string>& command) const;
  std::string log() const;
  // The test driver's live objects in GPU 0's server, by kind ("objects", "streams", "events",
  // "device_bytes", ...: tests/testdriver/query_socket.cpp); empty if the server does not answer.
  std::map<std::string, long long> driver_objects() const;

 private:
  std::string dir_;
  std::unique_ptr<Child> process_;
};

// The number of open file descriptors of a process (/proc/<pid>/fd); -1 if it cannot be read.
int open_fd_count(pid_t pid);

// The resident set of a process in KiB (VmRSS of /proc/<pid>/status); -1 if it cannot be read.
long long resident_kib(pid_t pid);

// Runs a client under the shim and waits for it.
Outcome run_client(const Daemon& daemon, const std::vector<std::string>& argv,
                   std::map<std::string, std::string> env = {});

// The pids `mpsshimctl ps` lists.
std::set<int> ps_pids(const Daemon& daemon);

// A line of `mpsshimctl server_list`: GPU PID STATE RESTARTS ISOLATION DETAILS.
struct ServerLine {
  int pid = -1;
  std::string state;
  int restarts = -1;
};
// Every GPU's line (its shared server's), by GPU index.
std::map<int, ServerLine> server_lines(const Daemon& daemon);
// GPU 0's line (pid -1 when there is none).
ServerLine server_line(const Daemon& daemon);

// An integer from the environment (a test's knob, such as a kill count), else `fallback`.
int env_int(const char* name, int fallback);

// Polls `done` (a look at the daemon or /proc, not a wait for time to pass) until it holds or
// `timeout` passes.
template <typename Pred>
bool eventually(Pred done, std::chrono::seconds timeout = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace mpsshim::e2e

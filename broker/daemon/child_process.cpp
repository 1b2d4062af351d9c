#include "broker/daemon/child_process.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

extern char** environ;

namespace mpsshim::daemon {

namespace {

constexpr int kChildControlFd = 3;

// Our environment, minus the mpsshim client library in LD_PRELOAD: if a server inherited it,
// its dlopen of the real driver would find the shim instead. Minus NVIDIA MPS's directories
// too: in the daemon's environment they name mpsshimd's own directory (MPS's names are the
// shim's), which a server's real driver would take for an NVIDIA MPS daemon's. A server is an
// NVIDIA MPS client only when asked (`nvidia_mps_pipe_directory`).
std::vector<std::string> server_environment(const std::string& nvidia_mps_pipe_directory) {
  std::vector<std::string> env;
  if (!nvidia_mps_pipe_directory.empty()) {
    env.push_back("CUDA_MPS_PIPE_DIRECTORY=" + nvidia_mps_pipe_directory);
  }
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view item(*entry);
    if (item.starts_with("CUDA_MPS_PIPE_DIRECTORY=") ||
        item.starts_with("CUDA_MPS_LOG_DIRECTORY=")) {
      continue;
    }
    if (!item.starts_with("LD_PRELOAD=")) {
      env.emplace_back(item);
      continue;
    }
    std::string kept;
    std::istringstream libraries{std::string(item.substr(std::strlen("LD_PRELOAD=")))};
    std::string library;
    while (libraries >> library) {
      std::size_t slash = library.rfind('/');
      if (library.substr(slash == std::string::npos ? 0 : slash + 1).starts_with("libmpsshim")) {
        continue;
      }
      kept += (kept.empty() ? "" : " ") + library;
    }
    if (!kept.empty()) env.push_back("LD_PRELOAD=" + kept);
  }
  return env;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Runs in the child between fork and exec; reports failure through `report_fd`.
[[noreturn]] void exec_child(const SpawnRequest& request, char* const* argv, char* const* envp,
                             int report_fd, pid_t daemon_pid) {
  if (report_fd == kChildControlFd) report_fd = ::fcntl(report_fd, F_DUPFD_CLOEXEC, 10);
  auto fail = [&report_fd](int error) {
    ssize_t ignored = ::write(report_fd, &error, sizeof error);
    (void)ignored;
    ::_exit(127);
  };
  // A server must not outlive the daemon that would restart and route to it.
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) fail(errno);
  if (::getppid() != daemon_pid) ::_exit(0);  // the daemon died before prctl
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);

  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0) fail(errno);
  if (request.output_fd >= 0 && request.output_fd != STDOUT_FILENO) {
    if (::dup2(request.output_fd, STDOUT_FILENO) < 0) fail(errno);
  }
  if (request.output_fd >= 0 && request.output_fd != STDERR_FILENO) {
    if (::dup2(request.output_fd, STDERR_FILENO) < 0) fail(errno);
  }
  if (request.control_fd == kChildControlFd) {
    // dup2 onto itself would keep O_CLOEXEC.
    if (::fcntl(kChildControlFd, F_SETFD, 0) != 0) fail(errno);
  } else if (::dup2(request.control_fd, kChildControlFd) < 0) {
    fail(errno);
  }
  ::execve(request.executable.c_str(), argv, envp);
  fail(errno);
  ::_exit(127);  // not reached: fail() exits
}

}  // namespace

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

tl::expected<ChildProcess, std::string> spawn_child(const SpawnRequest& request) {
  // Everything the child needs is built before fork: between fork and exec the child only makes
  // async-signal-safe calls.
  std::vector<std::string> arguments{request.executable};
  arguments.insert(arguments.end(), request.arguments.begin(), request.arguments.end());
  std::vector<char*> argv = pointers_to(arguments);
  std::vector<std::string> environment = server_environment(request.nvidia_mps_pipe_directory);
  std::vector<char*> envp = pointers_to(environment);

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    return tl::unexpected(fmt::format("pipe: {}", std::strerror(errno)));
  }
  proto::UniqueFd report_read(report[0]);
  proto::UniqueFd report_write(report[1]);
  pid_t daemon_pid = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return tl::unexpected(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) exec_child(request, argv.data(), envp.data(), report_write.get(), daemon_pid);

  report_write.reset();
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &child_errno, sizeof child_errno);  // EOF = exec succeeded
  } while (n < 0 && errno == EINTR);
  if (n == sizeof child_errno) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return tl::unexpected(
        fmt::format("cannot run {}: {}", request.executable, std::strerror(child_errno)));
  }
  ChildProcess child;
  child.pid = pid;
  child.pidfd.reset(pidfd_open(pid));  // the child is ours until reaped, so this cannot race
  return child;
}

void signal_child(const ChildProcess& child, int signal) {
  if (child.pid <= 0) return;
#ifdef SYS_pidfd_send_signal
  if (child.pidfd && ::syscall(SYS_pidfd_send_signal, child.pidfd.get(), signal, nullptr, 0) == 0) {
    return;
  }
#endif
  ::kill(child.pid, signal);
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    // The server's exit codes (broker/server): 70 = EX_SOFTWARE, used after a sticky GPU fault.
    switch (code) {
      case 0:
        return "exited normally";
      case 70:
        return "exited with status 70 (GPU fault)";
      case 127:
        return "exited with status 127 (could not be executed)";
      default:
        return fmt::format("exited with status {}", code);
    }
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{}){}", sig, name != nullptr ? name : "?",
                       WCOREDUMP(status) ? ", core dumped" : "");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

std::string process_name(pid_t pid) {
  std::ifstream comm(fmt::format("/proc/{}/comm", pid));
  std::string name;
  if (!std::getline(comm, name) || name.empty()) return "?";
  return name;
}

}  // namespace mpsshim::daemon

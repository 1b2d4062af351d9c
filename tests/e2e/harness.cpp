#include "harness.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace mpsshim::e2e {

std::string artefact(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr) throw std::runtime_error(std::string("test environment lacks ") + variable);
  return value;
}

std::string shim_preload() {
  const char* first = std::getenv("SANITIZER_PRELOAD");
  if (first == nullptr || *first == '\0') return artefact("LIBMPSSHIM");
  return std::string(first) + " " + artefact("LIBMPSSHIM");
}

Child::Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
             bool stdin_pipe) {
  int out[2], err[2], in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  if (stdin_pipe && pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  pid_ = fork();
  if (pid_ == 0) {
    if (in[0] >= 0) dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (in[0] >= 0) close(in[0]);
  in_fd_ = in[1];
  out_fd_ = out[0];
  err_fd_ = err[0];
}

Child::~Child() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  close_stdin();
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void Child::close_stdin() {
  if (in_fd_ >= 0) close(in_fd_);
  in_fd_ = -1;
}

void Child::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (poll(fds, 2, timeout_ms) <= 0) return;
  char buffer[4096];
  for (int i = 0; i < 2; ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
    ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
    if (n > 0) (i == 0 ? out_ : err_).append(buffer, static_cast<std::size_t>(n));
  }
}

bool Child::wait_for_output(const std::string& text, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (out_.find(text) != std::string::npos) return true;
    int status;
    if (!reaped_ && waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      outcome_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      pump(100);
      return out_.find(text) != std::string::npos;
    }
    pump(50);
  }
  return false;
}

void Child::kill(int signal) {
  if (!reaped_) ::kill(pid_, signal);
}

Outcome Child::wait(std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    int status;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      outcome_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      reaped_ = true;
      outcome_.exit_code = -SIGKILL;
      err_ += "\n[harness: killed after timeout]";
      break;
    }
    pump(20);
  }
  // Drain what is left.
  for (int i = 0; i < 50; ++i) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (poll(fds, 2, 0) <= 0) break;
    pump(0);
  }
  outcome_.out = out_;
  outcome_.err = err_;
  return outcome_;
}

Daemon::Daemon(std::vector<std::string> extra_args, std::map<std::string, std::string> env) {
  char pattern[] = "/tmp/mpsshim-e2e-XXXXXX";
  if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp");
  dir_ = pattern;
  std::vector<std::string> argv = {artefact("MPSSHIMD"),
                                   "--runtime-dir",
                                   dir_,
                                   "--server",
                                   artefact("MPSSHIM_SERVER"),
                                   "--driver",
                                   artefact("MPSSHIM_TESTDRIVER"),
                                   "--log-level",
                                   "info",
                                   "--log-file",
                                   dir_ + "/daemon.log"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  // The daemon's and its servers' stderr go to a file: a pipe nobody drains would block them.
  std::vector<std::string> shell = {"/bin/sh", "-c", "exec \"$@\" >>\"$0\" 2>&1",
                                    dir_ + "/stderr.log"};
  shell.insert(shell.end(), argv.begin(), argv.end());
  env.emplace("MPSSHIM_TESTDRIVER_QUERY_SOCKET", dir_ + "/testdriver-query");
  process_ = std::make_unique<Child>(shell, env);
  // Ready when mpsshimctl gets an answer listing a running server and none still starting
  // (with two GPUs the daemon answers once the first is up; a client of the second would be
  // refused, "its server is starting").
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    Outcome list = ctl({"server_list"});
    if (list.exit_code == 0 && list.out.find("running") != std::string::npos &&
        list.out.find("starting") == std::string::npos) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw std::runtime_error("mpsshimd did not become ready; log:\n" + log());
}

Daemon::~Daemon() {
  if (process_) {
    process_->kill(SIGTERM);
    process_->wait(std::chrono::seconds(20));
  }
  std::string cmd = "rm -rf '" + dir_ + "'";
  [[maybe_unused]] int rc = std::system(cmd.c_str());
}

std::map<std::string, std::string> Daemon::client_env(
    std::map<std::string, std::string> extra) const {
  extra["CUDA_MPS_PIPE_DIRECTORY"] = dir_;
  extra["LD_PRELOAD"] = shim_preload();
  return extra;
}

Outcome Daemon::ctl(const std::vector<std::string>& command) const {
  std::vector<std::string> argv = {artefact("MPSSHIMCTL"), "--runtime-dir", dir_};
  argv.insert(argv.end(), command.begin(), command.end());
  Child child(argv, {});
  return child.wait(std::chrono::seconds(20));
}

std::string Daemon::log() const {
  std::string text;
  for (const char* name : {"/daemon.log", "/stderr.log"}) {
    FILE* f = std::fopen((dir_ + name).c_str(), "r");
    if (f == nullptr) continue;
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
    std::fclose(f);
  }
  return text;
}

std::map<std::string, long long> Daemon::driver_objects() const {
  const std::string path = dir_ + "/testdriver-query";
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) return {};
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  std::string line;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    char buffer[512];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof buffer)) > 0) line.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  std::map<std::string, long long> counts;
  std::istringstream fields(line);
  for (std::string field; fields >> field;) {
    const auto eq = field.find('=');
    if (eq != std::string::npos) counts[field.substr(0, eq)] = std::stoll(field.substr(eq + 1));
  }
  return counts;
}

long long resident_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

int open_fd_count(pid_t pid) {
  DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

Outcome run_client(const Daemon& daemon, const std::vector<std::string>& argv,
                   std::map<std::string, std::string> env) {
  Child child(argv, daemon.client_env(std::move(env)));
  return child.wait(std::chrono::seconds(120));
}

std::map<int, ServerLine> server_lines(const Daemon& daemon) {
  std::map<int, ServerLine> out;
  std::istringstream lines(daemon.ctl({"server_list"}).out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    int gpu = -1;
    ServerLine s;
    std::string isolation;
    // Isolation groups' servers follow the shared ones; only the latter are a GPU's line.
    if (fields >> gpu >> s.pid >> s.state >> s.restarts >> isolation && isolation == "shared") {
      out[gpu] = s;
    }
  }
  return out;
}

ServerLine server_line(const Daemon& daemon) {
  auto lines = server_lines(daemon);
  auto it = lines.find(0);
  return it == lines.end() ? ServerLine{} : it->second;
}

std::set<int> ps_pids(const Daemon& daemon) {
  Outcome ps = daemon.ctl({"ps"});
  std::set<int> pids;
  std::istringstream lines(ps.out);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    int pid = 0;
    if (std::istringstream(line) >> pid) pids.insert(pid);
  }
  return pids;
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != 0 ? std::atoi(value) : fallback;
}

}  // namespace mpsshim::e2e

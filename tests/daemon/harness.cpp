#include "tests/daemon/harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "broker/daemon/wire.hpp"

extern char** environ;

namespace mpsshim::daemon_test {

namespace {

std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    // Nothing from the caller's environment may point the programs elsewhere.
    if (key == "CUDA_MPS_PIPE_DIRECTORY" || key == "NOTIFY_SOCKET" || key.starts_with("FAKE_") ||
        overrides.contains(key)) {
      continue;
    }
    env.push_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// fork + exec with stdin/stdout/stderr on the given fds (-1: /dev/null).
pid_t spawn(std::vector<std::string> argv, const std::map<std::string, std::string>& env, int in,
            int out, int err) {
  std::vector<std::string> environment = environment_with(env);
  std::vector<char*> argp = pointers(argv);
  std::vector<char*> envp = pointers(environment);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int null_fd = ::open("/dev/null", O_RDWR);
    ::dup2(in >= 0 ? in : null_fd, 0);
    ::dup2(out >= 0 ? out : null_fd, 1);
    ::dup2(err >= 0 ? err : null_fd, 2);
    ::execve(argp[0], argp.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

int decode_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

}  // namespace

bool wait_until(const std::function<bool()>& condition, Clock::duration timeout) {
  auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::string artefact(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr)
    throw std::runtime_error(std::string(variable) + " is not set (run via meson test)");
  return value;
}

Outcome run_program(const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env, const std::string& input) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  pid_t pid = spawn(argv, env, in[0], out[1], err[1]);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  // Small inputs only: fits the pipe buffer, so no need to interleave with reading.
  if (!input.empty() && ::write(in[1], input.data(), input.size()) < 0) {
    throw std::runtime_error("write to child stdin failed");
  }
  ::close(in[1]);
  Outcome outcome;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&outcome.out, &outcome.err};
  int open_count = 2;
  while (open_count > 0) {
    if (::poll(fds, 2, 60'000) <= 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  outcome.exit_code = decode_status(status);
  return outcome;
}

TempDir::TempDir() {
  char pattern[] = "/tmp/mpsshimd-test-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::string command = "rm -rf '" + path_ + "'";
  [[maybe_unused]] int rc = std::system(command.c_str());
}

NotifySocket::NotifySocket(std::string name)
    : name_(std::move(name)), fd_(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, name_.data(), name_.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
  if (name_.front() == '@') {
    address.sun_path[0] = '\0';
  } else {
    length += 1;
  }
  if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    throw std::runtime_error("cannot bind notify socket " + name_);
  }
}

bool NotifySocket::wait_for(const std::string& needle, Clock::duration timeout) {
  for (const auto& datagram : received_) {
    if (datagram.find(needle) != std::string::npos) return true;
  }
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buffer[4096];
    ssize_t n = ::recv(fd_.get(), buffer, sizeof buffer, 0);
    if (n <= 0) continue;
    received_.emplace_back(buffer, static_cast<std::size_t>(n));
    if (received_.back().find(needle) != std::string::npos) return true;
  }
  return false;
}

namespace {

std::string notify_name(const std::string& base, bool abstract) {
  static int counter = 0;
  if (abstract)
    return "@mpsshimd-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
  return base + "/notify";
}

}  // namespace

DaemonUnderTest::DaemonUnderTest(DaemonConfig config)
    : runtime_dir_(tmp_.path() + "/run"),
      notify_(notify_name(tmp_.path(), config.abstract_notify_socket)) {
  std::vector<std::string> argv{artefact("MPSSHIMD"), "--server", artefact("FAKE_SERVER"),
                                "--log-file", tmp_.path() + "/daemon.log"};
  std::map<std::string, std::string> env = config.env;
  env["FAKE_SERVER_DEVICES"] = std::to_string(config.gpus);
  env["NOTIFY_SOCKET"] = notify_.name();
  if (config.runtime_dir_from_env) {
    env["CUDA_MPS_PIPE_DIRECTORY"] = runtime_dir_;
  } else {
    argv.insert(argv.end(), {"--runtime-dir", runtime_dir_});
  }
  argv.insert(argv.end(), config.args.begin(), config.args.end());
  int err = ::open((tmp_.path() + "/stderr.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                   0644);
  pid_ = spawn(argv, env, -1, err, err);
  ::close(err);
  if (config.wait_ready && !notify_.wait_for("READY=1")) {
    throw std::runtime_error("mpsshimd sent no READY=1; log:\n" + log());
  }
}

DaemonUnderTest::~DaemonUnderTest() {
  if (!reaped_ && !stop(SIGTERM)) {
    ::kill(pid_, SIGKILL);
    wait_exit();
  }
}

std::string DaemonUnderTest::log() const {
  std::string text;
  for (const char* name : {"/daemon.log", "/stderr.log"}) {
    std::ifstream file(tmp_.path() + name);
    std::stringstream content;
    content << file.rdbuf();
    text += content.str();
  }
  return text;
}

Outcome DaemonUnderTest::ctl(const std::vector<std::string>& args, const std::string& input) const {
  std::vector<std::string> argv{artefact("MPSSHIMCTL"), "--runtime-dir", runtime_dir_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, {}, input);
}

std::map<int, DaemonUnderTest::ServerRow> DaemonUnderTest::servers() const {
  std::map<int, ServerRow> rows;
  std::istringstream lines(ctl({"server_list"}).out);
  std::string line;
  std::getline(lines, line);  // GPU PID STATE RESTARTS DETAILS
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    int gpu;
    std::string pid;
    ServerRow row;
    if (!(fields >> gpu >> pid >> row.state >> row.restarts)) continue;
    row.pid = pid == "-" ? 0 : std::atoi(pid.c_str());
    rows[gpu] = row;
  }
  return rows;
}

std::map<int, pid_t> DaemonUnderTest::server_pids() const {
  std::map<int, pid_t> pids;
  for (const auto& [gpu, row] : servers()) pids[gpu] = row.pid;
  return pids;
}

std::optional<int> DaemonUnderTest::wait_exit(Clock::duration timeout) {
  if (reaped_) return std::nullopt;
  std::optional<int> code;
  wait_until(
      [&] {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
        reaped_ = true;
        code = decode_status(status);
        return true;
      },
      timeout);
  return code;
}

std::optional<int> DaemonUnderTest::stop(int signal, Clock::duration timeout) {
  if (reaped_) return std::nullopt;
  ::kill(pid_, signal);
  return wait_exit(timeout);
}

bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // A zombie no one has reaped yet is not running either.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

proto::ClientHello make_hello(proto::MessageKind kind, const std::string& visible_devices,
                              int device) {
  proto::ClientHello hello{};
  hello.header = proto::make_header(kind, sizeof hello);
  hello.pid = ::getpid();
  hello.device = device;
  hello.active_thread_percentage = proto::kUnset;
  hello.priority = proto::kUnset;
  std::memcpy(hello.visible_devices, visible_devices.data(),
              std::min(visible_devices.size(), sizeof hello.visible_devices - 1));
  std::memcpy(hello.program, "daemon_test", 11);
  return hello;
}

proto::Received exchange(const std::string& socket_path, const void* bytes, std::size_t size) {
  int fd = proto::connect_seqpacket(socket_path);
  if (fd < 0)
    throw std::runtime_error("cannot connect to " + socket_path + ": " + std::strerror(-fd));
  proto::UniqueFd socket(fd);
  timeval timeout{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (proto::send_message(fd, std::span(static_cast<const std::byte*>(bytes), size)) != 0) {
    throw std::runtime_error("send failed");
  }
  proto::Received answer;
  if (int error = proto::receive_message(fd, answer); error != 0) {
    throw std::runtime_error(std::string("no answer: ") + std::strerror(error));
  }
  return answer;
}

DeviceList query(const std::string& socket_path, const std::string& visible_devices) {
  proto::Received answer =
      exchange(socket_path, make_hello(proto::MessageKind::kClientQuery, visible_devices));
  DeviceList list;
  auto header = daemon::header_of(answer);
  if (!header) throw std::runtime_error("query: no answer");
  if (header->kind == static_cast<std::uint32_t>(proto::MessageKind::kRefused)) {
    list.refused = daemon::decode<proto::Refused>(answer);
    return list;
  }
  auto head = daemon::decode<proto::DaemonDevices>(answer);
  if (!head ||
      answer.bytes.size() != sizeof *head + head->device_count * sizeof(proto::DeviceSnapshot) ||
      head->header.size != answer.bytes.size()) {
    throw std::runtime_error("query: malformed DaemonDevices");
  }
  for (std::uint32_t i = 0; i < head->device_count; ++i) {
    proto::DeviceSnapshot snapshot;
    std::memcpy(&snapshot, answer.bytes.data() + sizeof *head + i * sizeof snapshot,
                sizeof snapshot);
    list.ordinals.push_back(snapshot.ordinal);
  }
  return list;
}

proto::Refused attach(const std::string& socket_path, const std::string& visible_devices,
                      int device) {
  proto::Received answer =
      exchange(socket_path, make_hello(proto::MessageKind::kClientAttach, visible_devices, device));
  auto refused = daemon::decode<proto::Refused>(answer);
  if (!refused) throw std::runtime_error("attach: the answer is not a Refused");
  return *refused;
}

}  // namespace mpsshim::daemon_test

#include "broker/daemon/background.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "broker/daemon/log.hpp"

namespace mpsshim::daemon {

namespace {

// The first byte the background process writes: every server runs, or not all of them (the
// daemon's status line follows).
constexpr char kReady = 'R';
constexpr char kPartly = 'P';

[[noreturn]] void wait_in_foreground(proto::UniqueFd pipe, pid_t child,
                                     const std::string& log_path) {
  std::string message;
  char buffer[512];
  for (;;) {
    const ssize_t n = ::read(pipe.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    message.append(buffer, static_cast<std::size_t>(n));
  }
  if (!message.empty() && message[0] == kReady) {
    fmt::print("mpsshimd is running in the background as pid {}; log: {}\n", child, log_path);
    std::fflush(stdout);
    ::_exit(0);
  }
  if (!message.empty() && message[0] == kPartly) {
    fmt::print(stderr,
               "mpsshimd: started in the background as pid {}, but not every GPU's server came "
               "up: {}; see {} (stop it with `mpsshimctl quit`)\n",
               child, message.substr(1), log_path);
    ::_exit(1);
  }
  fmt::print(stderr, "mpsshimd: the background daemon did not start; see {}\n", log_path);
  ::_exit(1);
}

}  // namespace

tl::expected<Background, std::string> Background::enter(const std::string& log_path) {
  int fds[2];
  // O_CLOEXEC: were a server to inherit the write end, the foreground would wait forever.
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return tl::unexpected(fmt::format("pipe: {}", std::strerror(errno)));
  }
  proto::UniqueFd read_end(fds[0]), write_end(fds[1]);
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child < 0) return tl::unexpected(fmt::format("fork: {}", std::strerror(errno)));
  if (child > 0) {
    write_end.reset();
    wait_in_foreground(std::move(read_end), child, log_path);
  }
  read_end.reset();
  ::setsid();
  if (::chdir("/") != 0) {
    return tl::unexpected(fmt::format("chdir /: {}", std::strerror(errno)));
  }
  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::close(null_fd);
  }
  ::dup2(log_fd(), STDERR_FILENO);
  return Background(std::move(write_end));
}

void Background::ready(bool every_server_running, const std::string& status) {
  if (!pipe_) return;
  const std::string message = (every_server_running ? kReady : kPartly) + status;
  ssize_t ignored = ::write(pipe_.get(), message.data(), message.size());
  (void)ignored;
  pipe_.reset();
}

}  // namespace mpsshim::daemon

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

constexpr char kReady = 'R';

[[noreturn]] void wait_in_foreground(proto::UniqueFd pipe, pid_t child,
                                     const std::string& log_path) {
  char byte = 0;
  ssize_t n;
  do {
    n = ::read(pipe.get(), &byte, 1);
  } while (n < 0 && errno == EINTR);
  if (n == 1 && byte == kReady) {
    fmt::print("mpsshimd is running in the background as pid {}; log: {}\n", child, log_path);
    std::fflush(stdout);
    ::_exit(0);
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

void Background::ready() {
  if (!pipe_) return;
  ssize_t ignored = ::write(pipe_.get(), &kReady, 1);
  (void)ignored;
  pipe_.reset();
}

}  // namespace mpsshim::daemon

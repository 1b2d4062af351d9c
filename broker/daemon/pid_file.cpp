#include "broker/daemon/pid_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "broker/daemon/child_process.hpp"

namespace mpsshim::daemon {

tl::expected<PidFile, std::string> PidFile::acquire(const std::string& path) {
  proto::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) {
    return tl::unexpected(fmt::format("cannot open pid file {}: {}", path, std::strerror(errno)));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char text[32] = {};
    ssize_t n = ::pread(fd.get(), text, sizeof text - 1, 0);
    std::string holder = n > 0 ? fmt::format("pid {}", std::atoi(text)) : "another process";
    return tl::unexpected(fmt::format(
        "another mpsshimd ({}) already runs in this directory (it holds {}); stop it with "
        "`mpsshimctl quit` or give this one another --runtime-dir",
        holder, path));
  }
  return PidFile(path, std::move(fd));
}

bool PidFile::wait_for_holder_to_exit(const std::string& path, std::chrono::milliseconds limit) {
  proto::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return errno == ENOENT;  // removed: its daemon has gone
  char text[32] = {};
  const ssize_t n = ::pread(fd.get(), text, sizeof text - 1, 0);
  const pid_t holder = n > 0 ? static_cast<pid_t>(std::atoi(text)) : 0;
  if (holder <= 0) return false;
  proto::UniqueFd pidfd(pidfd_open(holder));
  if (!pidfd) return errno == ESRCH;
  pollfd exited{pidfd.get(), POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int ready = ::poll(&exited, 1, static_cast<int>(left.count()));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

PidFile::~PidFile() = default;

tl::expected<void, std::string> PidFile::write_pid() {
  std::string text = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_.get(), 0) != 0 ||
      ::pwrite(fd_.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return tl::unexpected(fmt::format("cannot write pid file {}: {}", path_, std::strerror(errno)));
  }
  return {};
}

void PidFile::remove() {
  if (!fd_) return;
  ::unlink(path_.c_str());
  fd_.reset();
}

}  // namespace mpsshim::daemon

#include "broker/daemon/pid_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

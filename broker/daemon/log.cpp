#include "broker/daemon/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace mpsshim::daemon {
namespace {

// Owned by the daemon's event loop (main, then SIGHUP): the file and its path.
std::string g_path;

int open_append(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
}

}  // namespace

void configure_daemon_log(std::string program) {
  configure_log(LogIdentity{std::move(program), {}, true});
  set_log_fd(STDERR_FILENO);  // never MPSSHIM_LOG_FILE: that is the shim's
}

tl::expected<void, std::string> open_log_file(const std::string& path) {
  const int fd = open_append(path);
  if (fd < 0) {
    return tl::unexpected(fmt::format("cannot open log file {}: {}", path, std::strerror(errno)));
  }
  const int old = log_fd();
  set_log_fd(fd);
  if (old != STDERR_FILENO) ::close(old);
  g_path = path;
  return {};
}

void reopen_log_file() {
  if (g_path.empty()) return;
  const int fd = open_append(g_path);
  if (fd < 0) {
    log_error("cannot reopen log file {}: {}; still writing to the old one", g_path,
              std::strerror(errno));
    return;
  }
  const int old = log_fd();
  set_log_fd(fd);
  ::close(old);
}

}  // namespace mpsshim::daemon

#include "broker/daemon/sd_notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

Notifier Notifier::from_environment() {
  const char* env = std::getenv("NOTIFY_SOCKET");
  std::string path = env != nullptr ? env : "";
  ::unsetenv("NOTIFY_SOCKET");
  return Notifier(std::move(path));
}

bool Notifier::send(std::string_view state) const {
  if (path_.empty()) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path_.size() > sizeof address.sun_path - 1) return false;
  std::memcpy(address.sun_path, path_.data(), path_.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_.size());
  if (path_.front() == '@') {
    address.sun_path[0] = '\0';  // abstract: the name is exactly the bytes given, no terminator
  } else {
    length += 1;
  }
  proto::UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) return false;
  ssize_t n = ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
                       reinterpret_cast<const sockaddr*>(&address), length);
  return n == static_cast<ssize_t>(state.size());
}

}  // namespace mpsshim::daemon

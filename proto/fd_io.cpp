#include "proto/fd_io.hpp"

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>

namespace mpsshim::proto {

bool write_all(int fd, const void* data, std::size_t bytes) noexcept {
  const auto* p = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

bool pread_all(int fd, void* out, std::size_t bytes) noexcept {
  auto* p = static_cast<std::byte*>(out);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace mpsshim::proto

// SOCK_SEQPACKET unix sockets: one message per call, with file descriptors (SCM_RIGHTS) and
// peer credentials (SO_PEERCRED). Every fd is opened O_CLOEXEC so servers and clients never
// leak each other's descriptors into children.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mpsshim::proto {

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct PeerCredentials {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};

// A message received with its descriptors. bytes is empty on orderly hang-up.
struct Received {
  std::vector<std::byte> bytes;
  std::vector<UniqueFd> fds;
};

inline constexpr std::size_t kMaxMessageBytes = 1 << 20;
inline constexpr std::size_t kMaxFdsPerMessage = 4;

// Returns errno on failure, 0 on success. Retries EINTR.
int send_message(int socket, std::span<const std::byte> bytes, std::span<const int> fds = {});

template <typename T>
int send_struct(int socket, const T& value, std::span<const int> fds = {}) {
  return send_message(socket, std::as_bytes(std::span<const T, 1>(&value, 1)), fds);
}

// Blocks until a message arrives (or the socket is non-blocking and has none: errno EAGAIN).
// Extra descriptors beyond kMaxFdsPerMessage, and any attached to a truncated message, are
// closed. Returns the errno on failure.
int receive_message(int socket, Received& out);

std::optional<PeerCredentials> peer_credentials(int socket);

// Listening socket at `path` (an existing stale socket file is replaced). Returns -errno.
int listen_seqpacket(const std::string& path, int backlog = 128);
// Returns the connected fd or -errno.
int connect_seqpacket(const std::string& path);
// A connected pair; returns false on failure.
bool seqpacket_pair(UniqueFd& a, UniqueFd& b);

}  // namespace mpsshim::proto

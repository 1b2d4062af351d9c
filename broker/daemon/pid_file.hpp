// <runtime dir>/mpsshimd.pid, locked (flock) for the daemon's lifetime: the lock, not the file's
// existence, says a daemon owns the directory, so a crashed daemon's file is simply taken over.
#pragma once

#include <chrono>
#include <string>

#include <tl/expected.hpp>

#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

class PidFile {
 public:
  // Fails, naming the running daemon's pid, when another daemon holds the lock.
  static tl::expected<PidFile, std::string> acquire(const std::string& path);

  // Waits up to `limit` for the daemon whose pid `path` holds to exit. False when it is still
  // there, or when the file names no pid (a daemon that is starting has not written it yet).
  static bool wait_for_holder_to_exit(const std::string& path, std::chrono::milliseconds limit);

  PidFile(PidFile&&) = default;
  PidFile& operator=(PidFile&&) = default;
  ~PidFile();

  // Writes our pid (call after daemonizing).
  tl::expected<void, std::string> write_pid();
  // Unlinks the file; the lock goes with the descriptor.
  void remove();

 private:
  PidFile(std::string path, proto::UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  proto::UniqueFd fd_;
};

}  // namespace mpsshim::daemon

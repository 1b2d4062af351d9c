// -d/--daemon: fork into the background, the way nvidia-cuda-mps-control -d does, except that
// the foreground process waits until the daemon is ready, so `mpsshimd -d && mpsshimctl ...`
// works. It exits 1 (pointing at the log) when the daemon fails to start, and 1 with the reason
// when the daemon started but a GPU's server did not come up (the daemon keeps running then,
// serving the GPUs whose servers did, until `mpsshimctl quit`).
#pragma once

#include <string>

#include <tl/expected.hpp>

#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

class Background {
 public:
  // Returns only in the background process; the foreground process exits inside.
  static tl::expected<Background, std::string> enter(const std::string& log_path);

  // Lets the foreground process exit: 0 when every GPU's server runs, else 1 with `status`.
  void ready(bool every_server_running, const std::string& status);

 private:
  explicit Background(proto::UniqueFd pipe) : pipe_(std::move(pipe)) {}
  proto::UniqueFd pipe_;
};

}  // namespace mpsshim::daemon

// Where mpsshimd lives: the directory holding the control socket and the pid file. mpsshimctl
// (and the client library) look it up by the same rules.
#pragma once

#include <optional>
#include <string>

#include <tl/expected.hpp>

namespace mpsshim::daemon {

struct RuntimeDir {
  std::string path;
  std::string
      reason;  // why this one, for messages: "--runtime-dir", "CUDA_MPS_PIPE_DIRECTORY", ...
};

// --runtime-dir, else $CUDA_MPS_PIPE_DIRECTORY, else /run/mpsshim for root, else
// /tmp/mpsshim-<uid>.
RuntimeDir choose_runtime_dir(const std::optional<std::string>& option);

std::string control_socket_path(const std::string& dir);
std::string pid_file_path(const std::string& dir);

// Creates the directory (and missing parents) or adopts an existing one we own, and sets its
// mode: 0700 when only our uid may connect, 0755 with --multiuser. A directory owned by someone
// else is refused: whoever owns it could replace our socket.
tl::expected<void, std::string> prepare_runtime_dir(const std::string& dir, bool multiuser);

// True when something accepts connections on `socket_path` (a live daemon); false for a missing
// or stale socket file.
bool socket_answers(const std::string& socket_path);

// --nvidia-mps-pipe-directory: an NVIDIA MPS control daemon's pipe directory (its `control`
// FIFO there), and not mpsshimd's own runtime directory, which only looks like one to a driver.
tl::expected<void, std::string> check_nvidia_mps_pipe_directory(const std::string& dir,
                                                                const std::string& runtime_dir);

}  // namespace mpsshim::daemon

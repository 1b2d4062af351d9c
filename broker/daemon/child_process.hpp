// Starting, signalling and describing child processes (the per-GPU servers).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

struct ChildProcess {
  pid_t pid = 0;
  proto::UniqueFd pidfd;  // readable once the child exits; empty where the kernel lacks pidfd
};

struct SpawnRequest {
  std::string executable;
  std::vector<std::string> arguments;  // without argv[0]
  int control_fd = -1;                 // becomes fd 3 in the child
  int output_fd = -1;                  // becomes the child's stdout and stderr; -1 keeps ours
  // Non-empty: the child's CUDA_MPS_PIPE_DIRECTORY, so that its driver becomes a client of the
  // NVIDIA MPS daemon there (mpsshimd --nvidia-mps-pipe-directory).
  std::string nvidia_mps_pipe_directory{};
};

// fork + exec. Fails (with the reason exec gave) when the program cannot be started, so a
// missing or non-executable server is reported at once rather than as a mysterious exit. The
// child starts with default signal dispositions, an empty signal mask, stdin on /dev/null, no
// NOTIFY_SOCKET, no libmpsshim in LD_PRELOAD (a server must load the real driver), no
// CUDA_MPS_PIPE_DIRECTORY or CUDA_MPS_LOG_DIRECTORY but the request's, and is sent SIGTERM if
// the daemon dies.
tl::expected<ChildProcess, std::string> spawn_child(const SpawnRequest& request);

// A descriptor that becomes readable when `pid` exits, or -1 with errno (ESRCH: it is gone,
// ENOSYS: the kernel has no pidfd).
int pidfd_open(pid_t pid);

// pidfd_send_signal where there is a pidfd (no race with pid reuse), kill() otherwise.
void signal_child(const ChildProcess& child, int signal);

// "exited with status 70 (GPU fault)", "was killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int status);

// The process name of `pid` (/proc/<pid>/comm), or "?" when it is gone.
std::string process_name(pid_t pid);

}  // namespace mpsshim::daemon

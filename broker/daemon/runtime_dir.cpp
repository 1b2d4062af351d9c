#include "broker/daemon/runtime_dir.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

namespace {

tl::expected<void, std::string> make_parents(const std::string& dir) {
  for (std::size_t slash = dir.find('/', 1); slash != std::string::npos;
       slash = dir.find('/', slash + 1)) {
    std::string parent = dir.substr(0, slash);
    if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
      return tl::unexpected(fmt::format("cannot create {}: {}", parent, std::strerror(errno)));
    }
  }
  return {};
}

}  // namespace

RuntimeDir choose_runtime_dir(const std::optional<std::string>& option) {
  if (option && !option->empty()) return {*option, "--runtime-dir"};
  if (const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY"); env != nullptr && *env != '\0') {
    return {env, "CUDA_MPS_PIPE_DIRECTORY"};
  }
  if (::geteuid() == 0) return {"/run/mpsshim", "the default for root"};
  return {fmt::format("/tmp/mpsshim-{}", ::geteuid()),
          "the default for uid " + std::to_string(::geteuid())};
}

std::string control_socket_path(const std::string& dir) {
  return dir + "/" + proto::kControlSocketName;
}

std::string pid_file_path(const std::string& dir) {
  return dir + "/mpsshimd.pid";
}

tl::expected<void, std::string> prepare_runtime_dir(const std::string& dir, bool multiuser) {
  const mode_t mode = multiuser ? 0755 : 0700;
  if (auto parents = make_parents(dir); !parents) return parents;
  if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return tl::unexpected(
        fmt::format("cannot create runtime directory {}: {}", dir, std::strerror(errno)));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    return tl::unexpected(
        fmt::format("cannot inspect runtime directory {}: {}", dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return tl::unexpected(fmt::format("runtime directory {} is not a directory", dir));
  }
  if (st.st_uid != ::geteuid()) {
    return tl::unexpected(fmt::format(
        "runtime directory {} belongs to uid {}, not to uid {} that runs mpsshimd; remove it or "
        "choose another with --runtime-dir",
        dir, st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 07777) != mode && ::chmod(dir.c_str(), mode) != 0) {
    return tl::unexpected(fmt::format("cannot set mode {:o} on runtime directory {}: {}", mode, dir,
                                      std::strerror(errno)));
  }
  return {};
}

bool socket_answers(const std::string& socket_path) {
  int fd = proto::connect_seqpacket(socket_path);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

tl::expected<void, std::string> check_nvidia_mps_pipe_directory(const std::string& dir,
                                                                const std::string& runtime_dir) {
  char* real_dir = ::realpath(dir.c_str(), nullptr);
  char* real_runtime = ::realpath(runtime_dir.c_str(), nullptr);
  const bool same =
      real_dir != nullptr && real_runtime != nullptr && std::strcmp(real_dir, real_runtime) == 0;
  std::free(real_dir);
  std::free(real_runtime);
  if (same) {
    return tl::unexpected(fmt::format(
        "--nvidia-mps-pipe-directory {} is mpsshimd's own runtime directory: name the pipe "
        "directory of a running nvidia-cuda-mps-control",
        dir));
  }
  struct stat st {};
  if (::stat((dir + "/control").c_str(), &st) != 0) {
    return tl::unexpected(fmt::format(
        "--nvidia-mps-pipe-directory {}: no NVIDIA MPS control daemon there ({}/control: {}); "
        "start one first: CUDA_MPS_PIPE_DIRECTORY={} nvidia-cuda-mps-control -d",
        dir, dir, std::strerror(errno), dir));
  }
  return {};
}

}  // namespace mpsshim::daemon

#include "broker/daemon/paths.hpp"

#include <unistd.h>

#include <climits>

namespace mpsshim::daemon {

std::string absolute_path(const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace mpsshim::daemon

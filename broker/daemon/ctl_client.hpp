// Asking mpsshimd one operator command, as mpsshimctl does, for programs that talk to it (the
// Kubernetes device plugin). The daemon answers root and its own uid only.
#pragma once

#include <chrono>
#include <string>

#include <tl/expected.hpp>

namespace mpsshim::daemon {

struct CtlAnswer {
  int status = 0;  // the daemon's: 0 = ok
  std::string text;
};

// The answer, or why there is none (cannot connect, refused, no answer within `timeout`).
tl::expected<CtlAnswer, std::string> ask_daemon(const std::string& socket_path,
                                                const std::string& line,
                                                std::chrono::seconds timeout);

}  // namespace mpsshim::daemon

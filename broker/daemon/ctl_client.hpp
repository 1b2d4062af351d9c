// Asking mpsshimd one operator command: mpsshimctl and programs that talk to the daemon (the
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

struct CtlFailure {
  enum class Kind {
    kCannotConnect,  // no daemon at the socket (`error` is the errno)
    kNoAnswer,       // could not send, or no answer within the timeout
    kBadAnswer,      // refused us, hung up, or answered something that is not a reply
  };
  Kind kind;
  int error = 0;
  std::string message;  // a sentence naming the socket
};

// The answer, or why there is none.
tl::expected<CtlAnswer, CtlFailure> ask_daemon(const std::string& socket_path,
                                               const std::string& line,
                                               std::chrono::seconds timeout);

}  // namespace mpsshim::daemon

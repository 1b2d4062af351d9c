// systemd's readiness protocol (sd_notify(3)), spoken directly so the daemon needs no libsystemd:
// one datagram of "KEY=VALUE" lines to the socket named by $NOTIFY_SOCKET.
#pragma once

#include <string>
#include <string_view>

namespace mpsshim::daemon {

class Notifier {
 public:
  // Reads $NOTIFY_SOCKET and removes it from the environment so the servers we start do not
  // inherit it. Without it every send() is a no-op.
  static Notifier from_environment();
  explicit Notifier(std::string socket_path) : path_(std::move(socket_path)) {}

  bool enabled() const { return !path_.empty(); }
  // `state` is e.g. "READY=1\nSTATUS=serving 2 GPUs". Returns false when the datagram could not
  // be sent (systemd gone); the daemon carries on either way.
  bool send(std::string_view state) const;

 private:
  std::string path_;  // a leading '@' names the abstract namespace
};

}  // namespace mpsshim::daemon

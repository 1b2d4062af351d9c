// Who may talk to the daemon, decided from SO_PEERCRED (never from what the peer says).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

enum class PeerRole { kClient, kOperator };

struct AccessPolicy {
  uid_t daemon_uid;
  bool multiuser;  // clients of any uid; only honoured when the daemon runs as root

  // Why `peer` may not connect as `role`, or nullopt when it may. Clients: the daemon's uid, or
  // anyone with --multiuser. Operators (mpsshimctl): root or the daemon's uid, always.
  std::optional<std::string> refusal(const proto::PeerCredentials& peer, PeerRole role) const;
};

}  // namespace mpsshim::daemon

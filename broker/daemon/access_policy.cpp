#include "broker/daemon/access_policy.hpp"

#include <fmt/format.h>

namespace mpsshim::daemon {

std::optional<std::string> AccessPolicy::refusal(const proto::PeerCredentials& peer,
                                                 PeerRole role) const {
  if (peer.uid == daemon_uid) return std::nullopt;
  if (role == PeerRole::kOperator) {
    if (peer.uid == 0) return std::nullopt;
    return fmt::format("operator commands are taken from uid 0 and uid {} only, not from uid {}",
                       daemon_uid, peer.uid);
  }
  if (multiuser) return std::nullopt;
  return fmt::format(
      "this mpsshimd runs as uid {} and serves only uid {}, not uid {}: ask its operator to run it "
      "as root with --multiuser, or start your own mpsshimd and point CUDA_MPS_PIPE_DIRECTORY at "
      "its runtime directory",
      daemon_uid, daemon_uid, peer.uid);
}

}  // namespace mpsshim::daemon

#include "broker/daemon/isolation.hpp"

#include <fmt/format.h>

namespace mpsshim::daemon {

tl::expected<IsolationRule, std::string> parse_isolation_rule(std::string_view text) {
  if (text == "shared") return IsolationRule::kShared;
  if (text == "user") return IsolationRule::kUser;
  if (text == "allocation") return IsolationRule::kAllocation;
  if (text == "client") return IsolationRule::kClient;
  return tl::unexpected(
      fmt::format("--isolation takes shared, user, allocation or client, not `{}`", text));
}

std::string_view isolation_rule_name(IsolationRule rule) {
  switch (rule) {
    case IsolationRule::kShared:
      return "shared";
    case IsolationRule::kUser:
      return "user";
    case IsolationRule::kAllocation:
      return "allocation";
    case IsolationRule::kClient:
      return "client";
  }
  return "?";
}

std::string isolation_group(IsolationRule rule, const proto::PeerCredentials& peer,
                            const proto::ClientHello& hello, std::uint32_t allocation_id) {
  // Asking for its own group is always granted: it only takes away sharing.
  if ((hello.flags & proto::kHelloOwnIsolationGroup) != 0)
    return fmt::format("client:{}", peer.pid);
  switch (rule) {
    case IsolationRule::kShared:
      return "";
    case IsolationRule::kUser:
      return fmt::format("uid:{}", peer.uid);
    case IsolationRule::kAllocation:
      return allocation_id == 0 ? "" : fmt::format("allocation:{}", allocation_id);
    case IsolationRule::kClient:
      return fmt::format("client:{}", peer.pid);
  }
  return "";
}

}  // namespace mpsshim::daemon

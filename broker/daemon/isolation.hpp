// Isolation groups: which server processes a client shares (docs/isolation.md).
//
// Clients of one group share a server, and so a CUDA context and a GPU address space, per GPU:
// their kernels overlap on the GPU, and one client's kernel can reach another's memory. Clients
// of different groups have different server processes: separate contexts, separate address
// spaces, a fault in one ends only that group's clients, and the GPU time-slices between them
// as between any processes. The operator picks the rule; a client can only ask for more
// isolation (MPSSHIM_ISOLATION=own), never for less.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

enum class IsolationRule {
  kShared,      // every client in the shared group (NVIDIA MPS's one server per GPU)
  kUser,        // a group per uid
  kAllocation,  // a group per Kubernetes allocation; clients without one share
  kClient,      // a group per client process
};

// "shared", "user", "allocation" or "client" (mpsshimd --isolation).
tl::expected<IsolationRule, std::string> parse_isolation_rule(std::string_view text);
std::string_view isolation_rule_name(IsolationRule rule);

// The group a client joins: "" for the shared servers, else the group's name ("uid:1000",
// "allocation:7", "client:4123").
std::string isolation_group(IsolationRule rule, const proto::PeerCredentials& peer,
                            const proto::ClientHello& hello, std::uint32_t allocation_id);

}  // namespace mpsshim::daemon

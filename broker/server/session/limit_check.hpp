// Checks a client's request against its per-client caps (client_limits.hpp) and says so in the
// log when one refuses it. Called by the op handlers on the session's worker.
#pragma once

#include <cstdint>

#include "broker/server/accounting/client_limits.hpp"
#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// True when the session may hold `more` on top of the `held` it has of `limit`. Otherwise
// false, and the first refusal of each kind per session is logged at warn level, naming the
// cap and the mpsshimd option that raises it; the caller fails the request
// (CUDA_ERROR_OUT_OF_MEMORY, as the driver does when it runs out of such objects).
bool within_client_limit(Session& session, ClientLimit limit, std::uint64_t held,
                         std::uint64_t more = 1);

// What the session holds of each counted kind now.
std::uint64_t held_of(const Session& session, ClientLimit limit);

// One more of `limit` on top of what the session holds.
inline bool within_client_limit(Session& session, ClientLimit limit) {
  return within_client_limit(session, limit, held_of(session, limit), 1);
}

// The session has as much GPU work in flight as it may (ClientLimit::kInFlight): its worker
// reads no more of its records until some completes (and does not count its waiting records
// as a reason to stay awake). in_flight_full logs the first time per session.
bool in_flight_at_cap(const Session& session);
bool in_flight_full(Session& session);

}  // namespace mpsshim::server

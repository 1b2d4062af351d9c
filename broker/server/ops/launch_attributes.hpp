// Launch attributes a client may pass with a launch (or a cluster occupancy query). Only the
// ones that carry plain values are allowed: one that names a handle or a pointer (events,
// graph nodes) would let the client reach into the server's objects.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <span>

#include "broker/server/session/session.hpp"
#include "proto/ops.hpp"

namespace mpsshim::server {

// Converts `count` wire attributes into driver attributes. PRIORITY gets the session's bias;
// an ACCESS_POLICY_WINDOW must lie in the client's memory. Anything else off the list:
// CUDA_ERROR_NOT_SUPPORTED.
CUresult convert_launch_attributes(const Session& session, std::span<const std::byte> wire,
                                   std::uint32_t count, CUlaunchAttribute* out);

}  // namespace mpsshim::server

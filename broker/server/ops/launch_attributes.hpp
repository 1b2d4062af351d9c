// Launch attributes a client may pass with a launch (or a cluster occupancy query). Only the
// ones that carry plain values are allowed: one that names a handle or a pointer (events,
// graph nodes) would let the client reach into the server's objects.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <span>

#include "broker/server/session/session.hpp"
#include "proto/ops.hpp"

namespace mpsshim::server {

// Converts `count` wire attributes into driver attributes. PRIORITY gets the session's bias;
// an ACCESS_POLICY_WINDOW must lie in the client's memory. Anything else off the list:
// CUDA_ERROR_NOT_SUPPORTED.
CUresult convert_launch_attributes(const Session& session, std::span<const std::byte> wire,
                                   std::uint32_t count, CUlaunchAttribute* out);

// The wire form of an attribute the driver answered (a stream's or a kernel node's get).
template <typename Value>
proto::WireLaunchAttribute wire_attribute(std::uint32_t id, const Value& value) {
  proto::WireLaunchAttribute out{id, 0, {}};
  static_assert(sizeof value == sizeof out.value);
  std::memcpy(out.value, &value, sizeof value);
  return out;
}

}  // namespace mpsshim::server

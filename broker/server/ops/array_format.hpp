// What CUDA arrays and mipmapped arrays share on the server (ops/copies.cpp,
// ops/mipmapped_array.cpp): the formats and flags mpsshim takes (the descriptor's wire and driver
// forms: proto/array_descriptor.hpp).
#pragma once

#include <cuda.h>

#include "broker/server/session/session.hpp"
#include "proto/array_descriptor.hpp"
#include "proto/ops_copies.hpp"

namespace mpsshim::server {

using proto::driver_descriptor;
using proto::wire_descriptor;

// CUDA_SUCCESS for plain 8/16/32-bit, half and float formats with 1, 2 or 4 channels, sparse
// or not, never deferred-mapping; otherwise the error to answer, logged (`what`: "a CUDA array").
CUresult check_array_format(const Session& session, const proto::ArrayDescriptor& d,
                            const char* what);

// The bytes an array of `bytes` is charged at creation: none for a sparse array, whose memory
// is the tile pools its tiles map (charged by cuMemCreate).
inline std::uint64_t charged_at_creation(const proto::ArrayDescriptor& d, std::uint64_t bytes) {
  return (d.flags & CUDA_ARRAY3D_SPARSE) != 0 ? 0 : bytes;
}

}  // namespace mpsshim::server

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

// CUDA_SUCCESS for plain 8/16/32-bit, half and float formats with 1, 2 or 4 channels, neither
// sparse nor deferred-mapping; otherwise the error to answer, logged (`what`: "a CUDA array").
CUresult check_array_format(const Session& session, const proto::ArrayDescriptor& d,
                            const char* what);

}  // namespace mpsshim::server

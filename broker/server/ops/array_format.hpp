// What CUDA arrays and mipmapped arrays share on the server (ops/copies.cpp,
// ops/mipmapped_array.cpp): the descriptor between its wire and driver forms, and the formats and
// flags mpsshim takes.
#pragma once

#include <cuda.h>

#include "broker/server/session/session.hpp"
#include "proto/ops_copies.hpp"

namespace mpsshim::server {

inline CUDA_ARRAY3D_DESCRIPTOR driver_descriptor(const proto::ArrayDescriptor& d) {
  CUDA_ARRAY3D_DESCRIPTOR out{};
  out.Width = d.width;
  out.Height = d.height;
  out.Depth = d.depth;
  out.Format = static_cast<CUarray_format>(d.format);
  out.NumChannels = d.channels;
  out.Flags = d.flags;
  return out;
}

inline proto::ArrayDescriptor wire_descriptor(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return {d.Width,       d.Height, d.Depth, static_cast<std::uint32_t>(d.Format),
          d.NumChannels, d.Flags,  0};
}

// CUDA_SUCCESS for plain 8/16/32-bit, half and float formats with 1, 2 or 4 channels, neither
// sparse nor deferred-mapping; otherwise the error to answer, logged (`what`: "a CUDA array").
CUresult check_array_format(const Session& session, const proto::ArrayDescriptor& d,
                            const char* what);

}  // namespace mpsshim::server

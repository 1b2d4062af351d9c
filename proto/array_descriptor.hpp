// A CUDA array's descriptor between its wire form (proto::ArrayDescriptor) and the driver's, for
// the shim (its calls and replies) and the server (its driver calls and replies) alike.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "proto/ops_copies.hpp"

namespace mpsshim::proto {

// `reserved` carries a mipmapped array's level count (kMipmappedArrayCreate); 0 otherwise.
inline ArrayDescriptor wire_descriptor(const CUDA_ARRAY3D_DESCRIPTOR& d,
                                       std::uint32_t reserved = 0) {
  return {d.Width,       d.Height, d.Depth, static_cast<std::uint32_t>(d.Format),
          d.NumChannels, d.Flags,  reserved};
}

inline CUDA_ARRAY3D_DESCRIPTOR driver_descriptor(const ArrayDescriptor& d) {
  CUDA_ARRAY3D_DESCRIPTOR out{};
  out.Width = d.width;
  out.Height = d.height;
  out.Depth = d.depth;
  out.Format = static_cast<CUarray_format>(d.format);
  out.NumChannels = d.channels;
  out.Flags = d.flags;
  return out;
}

}  // namespace mpsshim::proto

// A CUDA array's descriptor and query answers between their wire and driver forms, for CUDA
// arrays (array.cpp, driver_extras.cpp) and mipmapped arrays (mipmapped_array.cpp).
#pragma once

#include <cuda.h>

#include "proto/ops_copies.hpp"
#include "proto/ops_driver_extras.hpp"

namespace mpsshim::shim {

// `reserved` carries a mipmapped array's level count (kMipmappedArrayCreate).
inline proto::ArrayDescriptor wire_descriptor(const CUDA_ARRAY3D_DESCRIPTOR& d,
                                              std::uint32_t reserved = 0) {
  return {d.Width,       d.Height, d.Depth, static_cast<std::uint32_t>(d.Format),
          d.NumChannels, d.Flags,  reserved};
}

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

// Logs, once per `call`, that the server refused a format or flags mpsshim does not take.
void log_unsupported_array(const char* call, const CUDA_ARRAY3D_DESCRIPTOR& d) noexcept;

inline CUDA_ARRAY_SPARSE_PROPERTIES sparse_properties(const proto::ArrayQueryRep& r) {
  CUDA_ARRAY_SPARSE_PROPERTIES out{};
  out.tileExtent.width = r.tile_extent[0];
  out.tileExtent.height = r.tile_extent[1];
  out.tileExtent.depth = r.tile_extent[2];
  out.miptailFirstLevel = r.miptail_first_level;
  out.miptailSize = r.size;
  out.flags = r.flags;
  return out;
}

inline CUDA_ARRAY_MEMORY_REQUIREMENTS memory_requirements(const proto::ArrayQueryRep& r) {
  CUDA_ARRAY_MEMORY_REQUIREMENTS out{};
  out.size = r.size;
  out.alignment = r.alignment;
  return out;
}

}  // namespace mpsshim::shim

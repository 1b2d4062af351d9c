// A CUDA array's query answers between their wire and driver forms (the descriptor's:
// proto/array_descriptor.hpp), for CUDA arrays (array.cpp, driver_extras.cpp) and mipmapped
// arrays (mipmapped_array.cpp).
#pragma once

#include <cuda.h>

#include "proto/array_descriptor.hpp"
#include "proto/ops_copies.hpp"
#include "proto/ops_driver_extras.hpp"

namespace mpsshim::shim {

using proto::driver_descriptor;
using proto::wire_descriptor;

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

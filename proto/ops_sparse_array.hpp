// Payload of kMemMapArray: cuMemMapArrayAsync, tiles of the client's sparse CUDA arrays and
// mipmapped arrays mapped onto (or unmapped from) its tile-pool allocations, in the order of
// its stream (broker/server/ops/sparse_array.cpp, libshim/sparse_array.cpp, docs/copies.md).
// Arrays, mipmapped arrays and allocations are the server's ids; the device the operation runs
// on is the stream's, named by a flag instead of a bit of the client's device numbering.
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

// kMemMapArray -> nothing. `count` WireArrayMapInfo follow.
struct MemMapArrayReq {
  WireHandle stream;
  std::uint32_t count;
  std::uint32_t reserved;
};

// One CUarrayMapInfo. The sparse-level fields are the driver's subresource.sparseLevel; for a
// mip tail, `layer` is subresource.miptail.layer and tail_offset/tail_bytes its offset and size.
struct WireArrayMapInfo {
  std::uint32_t resource_type;     // CUresourcetype: an array or a mipmapped array
  std::uint32_t subresource_type;  // CUarraySparseSubresourceType
  WireHandle resource;             // ArrayObj or MipmappedArrayObj id
  std::uint32_t level;
  std::uint32_t layer;
  std::uint32_t offset_x, offset_y, offset_z;
  std::uint32_t extent_width, extent_height, extent_depth;
  std::uint64_t tail_offset;
  std::uint64_t tail_bytes;
  std::uint32_t operation;    // CUmemOperationType
  std::uint32_t handle_type;  // CUmemHandleType
  WireHandle allocation;      // PhysicalAllocObj id; 0: none (an unmap)
  std::uint64_t offset;       // into the allocation
  // kMapOnStreamDevice: the client's mask named exactly the stream's device; 0 otherwise (the
  // driver then answers a mask of 0 as it answers any wrong one).
  std::uint32_t device_mask;
  std::uint32_t flags;
  std::uint32_t driver_reserved[2];
};

inline constexpr std::uint32_t kMapOnStreamDevice = 1;
// Operations in one record (the ring's largest record holds ~2,700 of them); the shim sends
// longer lists in parts.
inline constexpr std::uint32_t kMapArrayMaxOperations = 2048;

static_assert(kWireSafe<MemMapArrayReq> && sizeof(MemMapArrayReq) == 16);
static_assert(kWireSafe<WireArrayMapInfo> && sizeof(WireArrayMapInfo) == 104);

}  // namespace mpsshim::proto

// Payloads of the 2D/3D copy, CUDA array and texture/surface object opcodes (Op 63..69).
//
// A 2D or 3D copy travels as one Copy3DReq: each side says where its bytes are (device memory,
// a pinned host region, a staging chunk, or a CUDA array of the client's) and the geometry of
// the box, as CUDA_MEMCPY3D does. A copy from or to pageable memory is split by the client into
// row groups that fit a staging chunk; each group is one record naming that chunk.
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

enum class CopySideKind : std::uint32_t {
  kDevice = 1,        // handle: device pointer of the side's origin (0, 0, 0)
  kPinnedRegion = 2,  // handle: region id; offset: bytes into the region
  kStagingChunk = 3,  // handle: chunk index; offset: bytes into the chunk
  kArray = 4,         // handle: array id; pitch and height unused
};

struct CopySide {
  std::uint64_t handle;
  std::uint64_t offset;
  std::uint64_t x_bytes;  // the box's origin: bytes into a row (arrays: element-aligned)
  std::uint64_t y;
  std::uint64_t z;
  std::uint64_t pitch;   // linear memory: bytes from one row to the next
  std::uint64_t height;  // linear memory: rows from one slice to the next
  CopySideKind kind;
  std::uint32_t generation;  // staging chunk: the generation this copy completes
};

// kCopy3D. One-way unless the copy must finish before the caller returns (kFlagReplyWhenDone).
struct Copy3DReq {
  WireHandle stream;
  std::uint64_t width_bytes;
  std::uint64_t height;  // rows
  std::uint64_t depth;   // slices
  CopySide src;
  CopySide dst;
};

// CUDA_ARRAY3D_DESCRIPTOR, fixed-width. A 1D array has height 0, a 2D one depth 0.
struct ArrayDescriptor {
  std::uint64_t width;
  std::uint64_t height;
  std::uint64_t depth;
  std::uint32_t format;  // CUarray_format
  std::uint32_t channels;
  std::uint32_t flags;  // CUDA_ARRAY3D_*
  std::uint32_t reserved;
};
struct ArrayCreateReq {  // kArrayCreate
  WireHandle ctx;
  ArrayDescriptor desc;
};
struct ArrayCreateRep {
  WireHandle array;
  std::uint64_t charged_bytes;  // counted against the client's memory limit
};
// kArrayDestroy takes a HandleReq.

// kMipmappedArrayCreate takes an ArrayCreateReq whose desc.reserved is the number of levels.
// kMipmappedArrayLevel: the CUDA array of one level (the same id each time it is asked for, while
// it lives); kMipmappedArrayDestroy takes a HandleReq.
struct ArrayLevelReq {
  WireHandle mipmap;
  std::uint32_t level;
  std::uint32_t reserved;
};
struct ArrayLevelRep {
  WireHandle array;
  ArrayDescriptor desc;  // the level's, as the driver made it
};

// CUDA_RESOURCE_DESC for array, mipmapped array, linear and pitch2D resources; `handle` is the
// array id, the mipmapped array id or the device pointer.
struct WireResourceDesc {
  std::uint32_t type;  // CUresourcetype
  std::uint32_t flags;
  std::uint64_t handle;
  std::uint32_t format;  // linear, pitch2D
  std::uint32_t channels;
  std::uint64_t size_bytes;  // linear
  std::uint64_t width;       // pitch2D, in elements
  std::uint64_t height;      // pitch2D
  std::uint64_t pitch;       // pitch2D, bytes
};
// CUDA_TEXTURE_DESC without its reserved tail.
struct WireTextureDesc {
  std::uint32_t address_mode[3];
  std::uint32_t filter_mode;
  std::uint32_t flags;
  std::uint32_t max_anisotropy;
  std::uint32_t mipmap_filter_mode;
  float mipmap_level_bias;
  float min_mipmap_level_clamp;
  float max_mipmap_level_clamp;
  float border_color[4];
};
// CUDA_RESOURCE_VIEW_DESC; present = 0 when the caller passed none.
struct WireResourceViewDesc {
  std::uint32_t present;
  std::uint32_t format;
  std::uint64_t width;
  std::uint64_t height;
  std::uint64_t depth;
  std::uint32_t first_mipmap_level;
  std::uint32_t last_mipmap_level;
  std::uint32_t first_layer;
  std::uint32_t last_layer;
};
struct TexObjectCreateReq {  // kTexObjectCreate
  WireHandle ctx;
  WireResourceDesc resource;
  WireTextureDesc texture;
  WireResourceViewDesc view;
};
struct SurfObjectCreateReq {  // kSurfObjectCreate
  WireHandle ctx;
  WireResourceDesc resource;
};
// Reply of both creates: the server's id (for destroy) and the driver's value, which the
// client passes to kernels as it is.
struct TexObjectRep {
  WireHandle object;
  std::uint64_t value;
};
// kTexObjectDestroy, kSurfObjectDestroy take a HandleReq.

// Bytes of one channel of a plain CUarray_format (8/16/32-bit integers, half, float); 0 for the
// packed, block-compressed and video formats.
constexpr std::uint32_t channel_bytes(std::uint32_t format) {
  switch (format) {
    case 0x01:  // CU_AD_FORMAT_UNSIGNED_INT8
    case 0x08:  // CU_AD_FORMAT_SIGNED_INT8
      return 1;
    case 0x02:  // CU_AD_FORMAT_UNSIGNED_INT16
    case 0x09:  // CU_AD_FORMAT_SIGNED_INT16
    case 0x10:  // CU_AD_FORMAT_HALF
      return 2;
    case 0x03:  // CU_AD_FORMAT_UNSIGNED_INT32
    case 0x0a:  // CU_AD_FORMAT_SIGNED_INT32
    case 0x20:  // CU_AD_FORMAT_FLOAT
      return 4;
    default:
      return 0;
  }
}
// Bytes of one element of a plain format with 1, 2 or 4 channels; 0 otherwise.
constexpr std::uint64_t element_bytes(std::uint32_t format, std::uint32_t channels) {
  if (channels != 1 && channels != 2 && channels != 4) return 0;
  return std::uint64_t{channel_bytes(format)} * channels;
}

#define MPSSHIM_WIRE_CHECK(T)                                    \
  static_assert(kWireSafe<T>, #T " must be trivially copyable"); \
  static_assert(sizeof(T) % 8 == 0, #T " must pad to 8 bytes");
MPSSHIM_WIRE_CHECK(CopySide)
MPSSHIM_WIRE_CHECK(Copy3DReq)
MPSSHIM_WIRE_CHECK(ArrayDescriptor)
MPSSHIM_WIRE_CHECK(ArrayCreateReq)
MPSSHIM_WIRE_CHECK(ArrayCreateRep)
MPSSHIM_WIRE_CHECK(ArrayLevelReq)
MPSSHIM_WIRE_CHECK(ArrayLevelRep)
MPSSHIM_WIRE_CHECK(WireResourceDesc)
MPSSHIM_WIRE_CHECK(WireTextureDesc)
MPSSHIM_WIRE_CHECK(WireResourceViewDesc)
MPSSHIM_WIRE_CHECK(TexObjectCreateReq)
MPSSHIM_WIRE_CHECK(SurfObjectCreateReq)
MPSSHIM_WIRE_CHECK(TexObjectRep)
#undef MPSSHIM_WIRE_CHECK
static_assert(sizeof(CopySide) == 64);
static_assert(sizeof(Copy3DReq) == 160);
static_assert(sizeof(ArrayDescriptor) == 40);
static_assert(sizeof(WireResourceDesc) == 56);
static_assert(sizeof(WireTextureDesc) == 56);
static_assert(sizeof(WireResourceViewDesc) == 48);
static_assert(sizeof(TexObjectCreateReq) == 168);

}  // namespace mpsshim::proto

// Payloads of the tensor-map opcodes (Op 110..111): Hopper's TMA descriptors. A CUtensorMap is
// 128 opaque bytes that the driver encodes on the host and a kernel receives by value (or in
// constant or global memory); it holds the tensor's device address, which is the same in the
// client and in the server (one address space), so the server's driver encodes it and the
// bytes go back to the client unchanged.
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

inline constexpr std::uint32_t kTensorMapMaxRank = 5;

enum class TensorMapKind : std::uint32_t { kTiled = 0, kIm2col = 1, kIm2colWide = 2 };

// Every argument of cuTensorMapEncodeTiled / Im2col / Im2colWide; arrays past `rank` (and the
// fields a kind does not take) are 0.
struct TensorMapEncodeReq {
  std::uint32_t kind;  // TensorMapKind
  std::uint32_t data_type;
  std::uint32_t rank;
  std::uint32_t interleave;
  std::uint32_t swizzle;
  std::uint32_t l2_promotion;
  std::uint32_t oob_fill;
  std::uint32_t wide_mode;  // CUtensorMapIm2ColWideMode (kIm2colWide)
  std::uint64_t global_address;
  std::uint64_t global_dim[kTensorMapMaxRank];
  std::uint64_t global_strides[kTensorMapMaxRank - 1];
  std::uint32_t box_dim[kTensorMapMaxRank];  // kTiled
  std::uint32_t element_strides[kTensorMapMaxRank];
  std::int32_t pixel_box_lower[kTensorMapMaxRank - 2];  // kIm2col; kIm2colWide: [0], width
  std::int32_t pixel_box_upper[kTensorMapMaxRank - 2];
  std::uint32_t channels_per_pixel;  // kIm2col, kIm2colWide
  std::uint32_t pixels_per_column;
};

// The encoded descriptor (kTensorMapEncode's answer and kTensorMapReplaceAddress's).
struct TensorMapRep {
  std::uint64_t words[16];
};

struct TensorMapReplaceReq {
  std::uint64_t words[16];
  std::uint64_t global_address;
};

#define MPSSHIM_WIRE_CHECK(T)                                    \
  static_assert(kWireSafe<T>, #T " must be trivially copyable"); \
  static_assert(sizeof(T) % 8 == 0, #T " must pad to 8 bytes");
MPSSHIM_WIRE_CHECK(TensorMapEncodeReq)
MPSSHIM_WIRE_CHECK(TensorMapRep)
MPSSHIM_WIRE_CHECK(TensorMapReplaceReq)
#undef MPSSHIM_WIRE_CHECK

}  // namespace mpsshim::proto

// Hopper's TMA descriptors: cuTensorMapEncodeTiled / Im2col / Im2colWide and
// cuTensorMapReplaceAddress, with the argument rules cuda.h documents for them (what the real
// driver refuses with CUDA_ERROR_INVALID_VALUE). The 128 bytes are this driver's own encoding:
// opaque to every caller, as the real driver's are.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr std::uint32_t kMagic = 0x544d4150;  // "TMAP"

struct Encoded {
  std::uint32_t magic;
  std::uint8_t kind, type, rank, interleave;
  std::uint8_t swizzle, l2, oob, wide_mode;
  std::uint16_t channels, pixels;
  std::uint64_t global;
  std::uint64_t dims[5];
  std::uint64_t strides[4];
  std::uint8_t box_minus_one[5];
  std::uint8_t element_strides[5];
  std::int16_t lower[3];
  std::int16_t upper[3];
};
static_assert(sizeof(Encoded) <= sizeof(CUtensorMap::opaque));
static_assert(std::is_trivially_copyable_v<Encoded>);

enum Kind : std::uint8_t { kTiled, kIm2col, kIm2colWide };

// Bytes per element; the packed 4- and 6-bit types count as one (their dims count values).
unsigned element_bytes(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
    case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
    case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
    case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
      return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
      return 8;
    default:
      return 4;
  }
}

bool is_float(CUtensorMapDataType type) {
  return type >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && type <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ;
}

unsigned swizzle_span(CUtensorMapSwizzle swizzle) {
  switch (swizzle) {
    case CU_TENSOR_MAP_SWIZZLE_NONE:
      return 0;
    case CU_TENSOR_MAP_SWIZZLE_32B:
      return 32;
    case CU_TENSOR_MAP_SWIZZLE_64B:
      return 64;
    default:
      return 128;
  }
}

struct Common {
  CUtensorMap* map;
  CUtensorMapDataType type;
  cuuint32_t rank;
  void* global;
  const cuuint64_t* dims;
  const cuuint64_t* strides;
  const cuuint32_t* element_strides;
  CUtensorMapInterleave interleave;
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2;
  CUtensorMapFloatOOBfill oob;
};

// The rules every kind shares; fills `e`.
CUresult check_common(const Common& c, cuuint32_t min_rank, Encoded& e) {
  if (c.map == nullptr || reinterpret_cast<std::uintptr_t>(c.map) % 64 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (c.type > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ||
      c.interleave > CU_TENSOR_MAP_INTERLEAVE_32B ||
      c.swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
      c.l2 > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      c.oob > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (c.rank < min_rank || c.rank > 5 ||
      (c.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && c.rank < 3))
    return CUDA_ERROR_INVALID_VALUE;
  if (c.dims == nullptr || c.element_strides == nullptr || (c.rank > 1 && c.strides == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  const bool wide_align = c.interleave == CU_TENSOR_MAP_INTERLEAVE_32B ||
                          c.type == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ||
                          c.type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B;
  const std::uint64_t align = wide_align ? 32 : 16;
  const auto global = reinterpret_cast<std::uint64_t>(c.global);
  if (global == 0 || global % align != 0) return CUDA_ERROR_INVALID_VALUE;
  if (c.interleave == CU_TENSOR_MAP_INTERLEAVE_32B && c.swizzle != CU_TENSOR_MAP_SWIZZLE_32B)
    return CUDA_ERROR_INVALID_VALUE;
  if (c.oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float(c.type))
    return CUDA_ERROR_INVALID_VALUE;
  std::memset(&e, 0, sizeof e);
  e.magic = kMagic;
  e.type = static_cast<std::uint8_t>(c.type);
  e.rank = static_cast<std::uint8_t>(c.rank);
  e.interleave = static_cast<std::uint8_t>(c.interleave);
  e.swizzle = static_cast<std::uint8_t>(c.swizzle);
  e.l2 = static_cast<std::uint8_t>(c.l2);
  e.oob = static_cast<std::uint8_t>(c.oob);
  e.global = global;
  for (cuuint32_t i = 0; i < c.rank; ++i) {
    if (c.dims[i] == 0 || c.dims[i] > (std::uint64_t{1} << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (c.element_strides[i] == 0 || c.element_strides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    e.dims[i] = c.dims[i];
    e.element_strides[i] = static_cast<std::uint8_t>(c.element_strides[i]);
    if (i + 1 < c.rank) {
      if (c.strides[i] % align != 0 || c.strides[i] >= (std::uint64_t{1} << 40))
        return CUDA_ERROR_INVALID_VALUE;
      e.strides[i] = c.strides[i];
    }
  }
  return CUDA_SUCCESS;
}

// The inner extent of the box in bytes against the swizzle's span (interleave none).
CUresult check_inner_box(const Common& c, std::uint64_t inner_elements) {
  if (c.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return CUDA_SUCCESS;
  const std::uint64_t inner = inner_elements * element_bytes(c.type);
  if (inner % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  const unsigned span = swizzle_span(c.swizzle);
  if (span != 0 && inner > span) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

void store(CUtensorMap* map, const Encoded& e) {
  std::memset(map->opaque, 0, sizeof map->opaque);
  std::memcpy(map->opaque, &e, sizeof e);
}

}  // namespace

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
    const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  return entry([&](State&) {
    const Common c{map,        type,    rank, global, dims, strides, element_strides,
                   interleave, swizzle, l2,   oob};
    Encoded e{};
    if (CUresult r = check_common(c, 1, e); r != CUDA_SUCCESS) return r;
    if (box == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (cuuint32_t i = 0; i < rank; ++i) {
      if (box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
      e.box_minus_one[i] = static_cast<std::uint8_t>(box[i] - 1);
    }
    if (CUresult r = check_inner_box(c, box[0]); r != CUDA_SUCCESS) return r;
    e.kind = kTiled;
    store(map, e);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
    const cuuint64_t* dims, const cuuint64_t* strides, const int* lower, const int* upper,
    cuuint32_t channels, cuuint32_t pixels, const cuuint32_t* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
    CUtensorMapFloatOOBfill oob) {
  return entry([&](State&) {
    const Common c{map,        type,    rank, global, dims, strides, element_strides,
                   interleave, swizzle, l2,   oob};
    Encoded e{};
    if (CUresult r = check_common(c, 3, e); r != CUDA_SUCCESS) return r;
    if (lower == nullptr || upper == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The corners' range narrows with the spatial dimensions: 16, 8 or 4 bits signed.
    const int bits = rank == 3 ? 16 : rank == 4 ? 8 : 4;
    const int low = -(1 << (bits - 1)), high = (1 << (bits - 1)) - 1;
    for (cuuint32_t i = 0; i + 2 < rank; ++i) {
      if (lower[i] < low || lower[i] > high || upper[i] < low || upper[i] > high)
        return CUDA_ERROR_INVALID_VALUE;
      e.lower[i] = static_cast<std::int16_t>(lower[i]);
      e.upper[i] = static_cast<std::int16_t>(upper[i]);
    }
    if (channels == 0 || channels > 256 || pixels == 0 || pixels > 1024)
      return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_inner_box(c, channels); r != CUDA_SUCCESS) return r;
    e.kind = kIm2col;
    e.channels = static_cast<std::uint16_t>(channels);
    e.pixels = static_cast<std::uint16_t>(pixels);
    store(map, e);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2colWide(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
    const cuuint64_t* dims, const cuuint64_t* strides, int lower_width, int upper_width,
    cuuint32_t channels, cuuint32_t pixels, const cuuint32_t* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  return entry([&](State&) {
    const Common c{map,        type,    rank, global, dims, strides, element_strides,
                   interleave, swizzle, l2,   oob};
    Encoded e{};
    if (CUresult r = check_common(c, 3, e); r != CUDA_SUCCESS) return r;
    if (mode > CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128 || interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
      return CUDA_ERROR_INVALID_VALUE;
    if (lower_width < -32768 || lower_width > 32767 || upper_width < -32768 ||
        upper_width > 32767 || channels == 0 || channels > 256 || pixels == 0 || pixels > 1024)
      return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_inner_box(c, channels); r != CUDA_SUCCESS) return r;
    e.kind = kIm2colWide;
    e.wide_mode = static_cast<std::uint8_t>(mode);
    e.lower[0] = static_cast<std::int16_t>(lower_width);
    e.upper[0] = static_cast<std::int16_t>(upper_width);
    e.channels = static_cast<std::uint16_t>(channels);
    e.pixels = static_cast<std::uint16_t>(pixels);
    store(map, e);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* map,
                                                                     void* global) {
  return entry([&](State&) {
    if (map == nullptr || reinterpret_cast<std::uintptr_t>(map) % 64 != 0)
      return CUDA_ERROR_INVALID_VALUE;
    Encoded e{};
    std::memcpy(&e, map->opaque, sizeof e);
    if (e.magic != kMagic) return CUDA_ERROR_INVALID_VALUE;
    const bool wide_align = e.interleave == CU_TENSOR_MAP_INTERLEAVE_32B ||
                            e.type == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ||
                            e.type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B;
    const auto address = reinterpret_cast<std::uint64_t>(global);
    if (address == 0 || address % (wide_align ? 32 : 16) != 0) return CUDA_ERROR_INVALID_VALUE;
    e.global = address;
    store(map, e);
    return CUDA_SUCCESS;
  });
}

}  // namespace mpsshim::testdriver

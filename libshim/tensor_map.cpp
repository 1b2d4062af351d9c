// Hopper's TMA descriptors. A CUtensorMap is 128 bytes the driver encodes on the host; a kernel
// gets them by value and its TMA unit reads the tensor at the device address they hold. Device
// addresses are one space across client and server, so the server's driver encodes them
// (proto/ops_tensor_map.hpp) and the bytes are the client's to pass on, as natively. Like the
// real driver these need no current context: with none, the first GPU's server answers.
#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "proto/ops_tensor_map.hpp"

using namespace mpsshim;
using namespace mpsshim::shim;

namespace {

// The session that answers: the current context's, a retained primary one's, else GPU 0's.
CUresult answering(Context*& ctx) {
  CUresult rc = context_for_library(ctx);
  if (rc == CUDA_ERROR_INVALID_CONTEXT) rc = primary_context(0, ctx);
  return rc;
}

// The driver's rule: a tensor map lives at a 64-byte aligned address.
bool placed(const CUtensorMap* map) {
  return map != nullptr && reinterpret_cast<std::uintptr_t>(map) % 64 == 0;
}

CUresult encode(CUtensorMap* map, const proto::TensorMapEncodeReq& request) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (!placed(map)) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult rc = answering(ctx); rc != CUDA_SUCCESS) return rc;
  proto::TensorMapRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kTensorMapEncode, request, &reply);
  if (rc == CUDA_SUCCESS) std::memcpy(map->opaque, reply.words, sizeof map->opaque);
  return rc;
}

// The arguments every kind shares; false when an array the rank needs is missing.
bool common_arguments(proto::TensorMapEncodeReq& req, proto::TensorMapKind kind,
                      CUtensorMapDataType type, cuuint32_t rank, void* global,
                      const cuuint64_t* dims, const cuuint64_t* strides,
                      const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                      CUtensorMapFloatOOBfill fill) {
  if (rank == 0 || rank > proto::kTensorMapMaxRank || dims == nullptr ||
      element_strides == nullptr || (rank > 1 && strides == nullptr)) {
    return false;
  }
  req.kind = static_cast<std::uint32_t>(kind);
  req.data_type = static_cast<std::uint32_t>(type);
  req.rank = rank;
  req.interleave = static_cast<std::uint32_t>(interleave);
  req.swizzle = static_cast<std::uint32_t>(swizzle);
  req.l2_promotion = static_cast<std::uint32_t>(l2);
  req.oob_fill = static_cast<std::uint32_t>(fill);
  req.global_address = reinterpret_cast<std::uint64_t>(global);
  for (cuuint32_t i = 0; i < rank; ++i) {
    req.global_dim[i] = dims[i];
    req.element_strides[i] = element_strides[i];
    if (i + 1 < rank) req.global_strides[i] = strides[i];
  }
  return true;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
    const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  proto::TensorMapEncodeReq req{};
  if (box == nullptr ||
      !common_arguments(req, proto::TensorMapKind::kTiled, type, rank, global, dims, strides,
                        element_strides, interleave, swizzle, l2, fill)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (cuuint32_t i = 0; i < rank; ++i) req.box_dim[i] = box[i];
  return encode(map, req);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
    const cuuint64_t* dims, const cuuint64_t* strides, const int* lower, const int* upper,
    cuuint32_t channels, cuuint32_t pixels, const cuuint32_t* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
    CUtensorMapFloatOOBfill fill) {
  proto::TensorMapEncodeReq req{};
  // Im2col tensors have 3 to 5 dimensions; the box corners cover the rank - 2 spatial ones.
  if (rank < 3 || lower == nullptr || upper == nullptr ||
      !common_arguments(req, proto::TensorMapKind::kIm2col, type, rank, global, dims, strides,
                        element_strides, interleave, swizzle, l2, fill)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (cuuint32_t i = 0; i + 2 < rank; ++i) {
    req.pixel_box_lower[i] = lower[i];
    req.pixel_box_upper[i] = upper[i];
  }
  req.channels_per_pixel = channels;
  req.pixels_per_column = pixels;
  return encode(map, req);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2colWide(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
    const cuuint64_t* dims, const cuuint64_t* strides, int lower_width, int upper_width,
    cuuint32_t channels, cuuint32_t pixels, const cuuint32_t* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  proto::TensorMapEncodeReq req{};
  if (rank < 3 ||
      !common_arguments(req, proto::TensorMapKind::kIm2colWide, type, rank, global, dims, strides,
                        element_strides, interleave, swizzle, l2, fill)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  req.pixel_box_lower[0] = lower_width;
  req.pixel_box_upper[0] = upper_width;
  req.channels_per_pixel = channels;
  req.pixels_per_column = pixels;
  req.wide_mode = static_cast<std::uint32_t>(mode);
  return encode(map, req);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* map, void* global) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (!placed(map)) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult rc = answering(ctx); rc != CUDA_SUCCESS) return rc;
  proto::TensorMapReplaceReq request{};
  std::memcpy(request.words, map->opaque, sizeof request.words);
  request.global_address = reinterpret_cast<std::uint64_t>(global);
  proto::TensorMapRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kTensorMapReplaceAddress, request, &reply);
  if (rc == CUDA_SUCCESS) std::memcpy(map->opaque, reply.words, sizeof map->opaque);
  return rc;
}

// Hopper's TMA descriptors (cuTensorMapEncodeTiled / Im2col / Im2colWide,
// cuTensorMapReplaceAddress): the server's driver encodes them and the 128 bytes go back to the
// client, which hands them to its kernels. Nothing is kept here: a descriptor names device memory
// by address, and a kernel's use of it is checked no differently from a raw pointer argument.
#include <cstring>

#include "broker/server/ops/ops.hpp"
#include "proto/ops_tensor_map.hpp"

namespace mpsshim::server {
namespace {

proto::TensorMapRep words_of(const CUtensorMap& map) {
  proto::TensorMapRep rep{};
  static_assert(sizeof rep.words == sizeof map.opaque);
  std::memcpy(rep.words, map.opaque, sizeof rep.words);
  return rep;
}

}  // namespace

OpResult op_tensor_map_encode(Call& call) {
  auto req = call.request<proto::TensorMapEncodeReq>();
  if (req.rank == 0 || req.rank > proto::kTensorMapMaxRank) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const DriverTable& cu = call.cu;
  CUtensorMap map{};
  void* global = reinterpret_cast<void*>(req.global_address);
  const auto type = static_cast<CUtensorMapDataType>(req.data_type);
  const auto interleave = static_cast<CUtensorMapInterleave>(req.interleave);
  const auto swizzle = static_cast<CUtensorMapSwizzle>(req.swizzle);
  const auto l2 = static_cast<CUtensorMapL2promotion>(req.l2_promotion);
  const auto fill = static_cast<CUtensorMapFloatOOBfill>(req.oob_fill);
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  switch (static_cast<proto::TensorMapKind>(req.kind)) {
    case proto::TensorMapKind::kTiled:
      r = cu.cuTensorMapEncodeTiled(&map, type, req.rank, global, req.global_dim,
                                    req.global_strides, req.box_dim, req.element_strides,
                                    interleave, swizzle, l2, fill);
      break;
    case proto::TensorMapKind::kIm2col:
      r = cu.cuTensorMapEncodeIm2col(&map, type, req.rank, global, req.global_dim,
                                     req.global_strides, req.pixel_box_lower, req.pixel_box_upper,
                                     req.channels_per_pixel, req.pixels_per_column,
                                     req.element_strides, interleave, swizzle, l2, fill);
      break;
    case proto::TensorMapKind::kIm2colWide:
      r = cu.cuTensorMapEncodeIm2colWide(
          &map, type, req.rank, global, req.global_dim, req.global_strides, req.pixel_box_lower[0],
          req.pixel_box_upper[0], req.channels_per_pixel, req.pixels_per_column,
          req.element_strides, interleave, static_cast<CUtensorMapIm2ColWideMode>(req.wide_mode),
          swizzle, l2, fill);
      break;
  }
  if (r != CUDA_SUCCESS) return call.done(r);
  return call.reply(words_of(map));
}

OpResult op_tensor_map_replace_address(Call& call) {
  auto req = call.request<proto::TensorMapReplaceReq>();
  CUtensorMap map{};
  std::memcpy(map.opaque, req.words, sizeof map.opaque);
  if (CUresult r =
          call.cu.cuTensorMapReplaceAddress(&map, reinterpret_cast<void*>(req.global_address));
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(words_of(map));
}

}  // namespace mpsshim::server

// Batched copies (cuMemcpyBatchAsync, cuMemcpy3DBatchAsync; serving engines swap KV-cache blocks
// this way): each copy of the batch is issued as its own asynchronous copy on the stream, in the
// batch's order. The driver promises no order within a batch, so issuing them in order is one of
// the orders it may take; the batch as a whole stays in stream order.
//
// Source access order: CU_MEMCPY_SRC_ACCESS_ORDER_STREAM and _ANY need nothing more (a pageable
// source is staged during the call anyway, copy.cpp). _DURING_API_CALL promises the caller that
// the source is read before the call returns, so a batch holding such a copy synchronizes its
// stream before it returns: stricter than the driver, never wrong.
#include <cuda.h>

#include <cstdint>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "proto/ops_copies.hpp"

// The per-thread-stream forms libshim defines (copy.cpp, copy3d.cpp, stream_event.cpp); cuda.h
// declares them only for programs built with per-thread default streams.
extern "C" {
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult CUDAAPI cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D*, CUstream);
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream);
}

using namespace mpsshim::shim;

namespace {

constexpr std::size_t kNoFailure = ~std::size_t{0};

bool valid_order(CUmemcpySrcAccessOrder order) {
  return order == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
         order == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL ||
         order == CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
}

// The stream a batch may go on: any but the legacy NULL stream (cuda.h), which the per-thread
// forms read as the thread's own stream.
bool stream_allowed(CUstream stream, bool per_thread) {
  if (stream == CU_STREAM_LEGACY) return false;
  return stream != nullptr || per_thread;
}

CUresult copy_1d(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream,
                 bool per_thread) {
  return per_thread ? cuMemcpyAsync_ptsz(dst, src, bytes, stream)
                    : cuMemcpyAsync(dst, src, bytes, stream);
}

CUresult finish(CUstream stream, bool per_thread, bool during_call) {
  if (!during_call) return CUDA_SUCCESS;
  return per_thread ? cuStreamSynchronize_ptsz(stream) : cuStreamSynchronize(stream);
}

CUresult batch_1d(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                  CUmemcpyAttributes* attrs, size_t* attrs_idxs, size_t num_attrs, size_t* fail_idx,
                  CUstream stream, bool per_thread) {
  if (fail_idx != nullptr) *fail_idx = kNoFailure;
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  // The attributes cover every copy: the first applies from copy 0, each from an index past the
  // previous one's, the last below count (cuda.h).
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      attrs_idxs == nullptr || num_attrs == 0 || num_attrs > count || attrs_idxs[0] != 0 ||
      !stream_allowed(stream, per_thread)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool during_call = false;
  for (std::size_t k = 0; k < num_attrs; ++k) {
    if ((k > 0 && attrs_idxs[k] <= attrs_idxs[k - 1]) || attrs_idxs[k] >= count ||
        !valid_order(attrs[k].srcAccessOrder)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    during_call |= attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) continue;
    if (CUresult rc = copy_1d(dsts[i], srcs[i], sizes[i], stream, per_thread); rc != CUDA_SUCCESS) {
      if (fail_idx != nullptr) *fail_idx = i;
      return rc;
    }
  }
  return finish(stream, per_thread, during_call);
}

// One side of a 3D batch copy as a CUDA_MEMCPY3D side; `element` is the copy's element size.
struct Side3D {
  CUmemorytype type = CU_MEMORYTYPE_UNIFIED;
  CUdeviceptr ptr = 0;
  CUarray array = nullptr;
  std::size_t x_bytes = 0, y = 0, z = 0, pitch = 0, height = 0;
};

// The element size an array operand gives the copy: its format's bytes times its channels; 0 for
// a pointer (or an array of a format without one).
std::uint64_t array_element(const CUmemcpy3DOperand& operand) {
  if (operand.type != CU_MEMCPY_OPERAND_TYPE_ARRAY) return 0;
  const Array* array = object_of<Array>(operand.op.array.array);
  if (array == nullptr) return 0;
  return mpsshim::proto::element_bytes(static_cast<std::uint32_t>(array->desc.Format),
                                       array->desc.NumChannels);
}

bool side_of(const CUmemcpy3DOperand& operand, const CUextent3D& extent, std::uint64_t element,
             Side3D& out) {
  if (operand.type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
    const auto& p = operand.op.ptr;
    if ((p.rowLength != 0 && p.rowLength < extent.width) ||
        (p.layerHeight != 0 && p.layerHeight < extent.height)) {
      return false;
    }
    out.type = CU_MEMORYTYPE_UNIFIED;
    out.ptr = p.ptr;
    out.pitch = (p.rowLength != 0 ? p.rowLength : extent.width) * element;
    out.height = p.layerHeight != 0 ? p.layerHeight : extent.height;
    return true;
  }
  if (operand.type == CU_MEMCPY_OPERAND_TYPE_ARRAY) {
    out.type = CU_MEMORYTYPE_ARRAY;
    out.array = operand.op.array.array;
    out.x_bytes = operand.op.array.offset.x * element;
    out.y = operand.op.array.offset.y;
    out.z = operand.op.array.offset.z;
    return true;
  }
  return false;
}

// The CUDA_MEMCPY3D of one batch operation; false for an operation the driver would refuse.
bool to_memcpy3d(const CUDA_MEMCPY3D_BATCH_OP& op, CUDA_MEMCPY3D& out) {
  if (op.extent.width == 0 || op.extent.height == 0 || op.extent.depth == 0 ||
      !valid_order(op.srcAccessOrder)) {
    return false;
  }
  // Pointer to pointer: bytes. With an array: the array's element; two arrays must agree.
  const std::uint64_t src_element = array_element(op.src);
  const std::uint64_t dst_element = array_element(op.dst);
  if ((op.src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY && src_element == 0) ||
      (op.dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY && dst_element == 0) ||
      (src_element != 0 && dst_element != 0 && src_element != dst_element)) {
    return false;
  }
  const std::uint64_t element =
      src_element != 0 ? src_element : (dst_element != 0 ? dst_element : 1);
  Side3D src, dst;
  if (!side_of(op.src, op.extent, element, src) || !side_of(op.dst, op.extent, element, dst)) {
    return false;
  }
  out = CUDA_MEMCPY3D{};
  out.srcMemoryType = src.type;
  out.srcDevice = src.ptr;
  out.srcArray = src.array;
  out.srcXInBytes = src.x_bytes;
  out.srcY = src.y;
  out.srcZ = src.z;
  out.srcPitch = src.pitch;
  out.srcHeight = src.height;
  out.dstMemoryType = dst.type;
  out.dstDevice = dst.ptr;
  out.dstArray = dst.array;
  out.dstXInBytes = dst.x_bytes;
  out.dstY = dst.y;
  out.dstZ = dst.z;
  out.dstPitch = dst.pitch;
  out.dstHeight = dst.height;
  out.WidthInBytes = op.extent.width * element;
  out.Height = op.extent.height;
  out.Depth = op.extent.depth;
  return true;
}

CUresult batch_3d(size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail_idx,
                  unsigned long long flags, CUstream stream, bool per_thread) {
  if (fail_idx != nullptr) *fail_idx = kNoFailure;
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (num_ops == 0 || ops == nullptr || flags != 0 || !stream_allowed(stream, per_thread)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool during_call = false;
  for (std::size_t i = 0; i < num_ops; ++i) {
    CUDA_MEMCPY3D copy{};
    if (!to_memcpy3d(ops[i], copy)) {
      if (fail_idx != nullptr) *fail_idx = i;
      return CUDA_ERROR_INVALID_VALUE;
    }
    during_call |= ops[i].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    CUresult rc =
        per_thread ? cuMemcpy3DAsync_v2_ptsz(&copy, stream) : cuMemcpy3DAsync_v2(&copy, stream);
    if (rc != CUDA_SUCCESS) {
      if (fail_idx != nullptr) *fail_idx = i;
      return rc;
    }
  }
  return finish(stream, per_thread, during_call);
}

}  // namespace

// CUDA 12.8's forms report the failing copy's index; CUDA 13's (_v2) do not.
MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                   size_t* sizes, size_t count,
                                                   CUmemcpyAttributes* attrs, size_t* attrs_idxs,
                                                   size_t num_attrs, size_t* fail_idx,
                                                   CUstream stream) {
  return batch_1d(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, stream, false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                        size_t* sizes, size_t count,
                                                        CUmemcpyAttributes* attrs,
                                                        size_t* attrs_idxs, size_t num_attrs,
                                                        size_t* fail_idx, CUstream stream) {
  return batch_1d(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, stream, true);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                      size_t* sizes, size_t count,
                                                      CUmemcpyAttributes* attrs, size_t* attrs_idxs,
                                                      size_t num_attrs, CUstream stream) {
  return batch_1d(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, nullptr, stream, false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                           size_t* sizes, size_t count,
                                                           CUmemcpyAttributes* attrs,
                                                           size_t* attrs_idxs, size_t num_attrs,
                                                           CUstream stream) {
  return batch_1d(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, nullptr, stream, true);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync(size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops,
                                                     size_t* fail_idx, unsigned long long flags,
                                                     CUstream stream) {
  return batch_3d(num_ops, ops, fail_idx, flags, stream, false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync_ptsz(size_t num_ops,
                                                          CUDA_MEMCPY3D_BATCH_OP* ops,
                                                          size_t* fail_idx,
                                                          unsigned long long flags,
                                                          CUstream stream) {
  return batch_3d(num_ops, ops, fail_idx, flags, stream, true);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync_v2(size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops,
                                                        unsigned long long flags, CUstream stream) {
  return batch_3d(num_ops, ops, nullptr, flags, stream, false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync_v2_ptsz(size_t num_ops,
                                                             CUDA_MEMCPY3D_BATCH_OP* ops,
                                                             unsigned long long flags,
                                                             CUstream stream) {
  return batch_3d(num_ops, ops, nullptr, flags, stream, true);
}

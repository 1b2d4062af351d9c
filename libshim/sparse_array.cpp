// cuMemMapArrayAsync: tiles of sparse CUDA arrays and mipmapped arrays mapped onto tile-pool
// allocations (cuMemCreate with CU_MEM_CREATE_USAGE_TILE_POOL) or unmapped, in the stream's
// order on the server (broker/server/ops/sparse_array.cpp, docs/copies.md). Here each entry's
// array and allocation become the server's ids; both must be of the stream's GPU. The device
// mask names a device in this process's numbering, the server's driver in its own: it travels
// as "exactly the stream's device" or "something else", which the driver refuses as it would.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/vmm_handle.hpp"
#include "proto/ops_sparse_array.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

// The wire form of one entry for the server of `ctx`, or the error to answer.
CUresult wire_entry(const CUarrayMapInfo& info, const Context* ctx, proto::WireArrayMapInfo& out) {
  out = proto::WireArrayMapInfo{};
  out.resource_type = static_cast<std::uint32_t>(info.resourceType);
  switch (info.resourceType) {
    case CU_RESOURCE_TYPE_ARRAY: {
      const Array* array = object_of<Array>(info.resource.array);
      if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      if (array->ctx->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;
      out.resource = array->wire;
      break;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      const MipmappedArray* mipmap = object_of<MipmappedArray>(info.resource.mipmap);
      if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      if (mipmap->ctx->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;
      out.resource = mipmap->wire;
      break;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  out.subresource_type = static_cast<std::uint32_t>(info.subresourceType);
  if (info.subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL) {
    out.layer = info.subresource.miptail.layer;
    out.tail_offset = info.subresource.miptail.offset;
    out.tail_bytes = info.subresource.miptail.size;
  } else {
    const auto& level = info.subresource.sparseLevel;
    out.level = level.level;
    out.layer = level.layer;
    out.offset_x = level.offsetX;
    out.offset_y = level.offsetY;
    out.offset_z = level.offsetZ;
    out.extent_width = level.extentWidth;
    out.extent_height = level.extentHeight;
    out.extent_depth = level.extentDepth;
  }
  out.operation = static_cast<std::uint32_t>(info.memOperationType);
  out.handle_type = static_cast<std::uint32_t>(info.memHandleType);
  if (info.memHandle.memHandle != 0) {
    Session* session = nullptr;
    if (CUresult rc = from_client(info.memHandle.memHandle, session, out.allocation);
        rc != CUDA_SUCCESS) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (session != ctx->session) return CUDA_ERROR_INVALID_VALUE;  // another GPU's memory
  }
  out.offset = info.offset;
  // A mask has 32 bits: a device past them cannot be named (the driver refuses such a mask).
  out.device_mask = ctx->device < 32 && info.deviceBitMask == (1u << ctx->device)
                        ? proto::kMapOnStreamDevice
                        : 0u;
  out.flags = info.flags;
  out.driver_reserved[0] = info.reserved[0];
  out.driver_reserved[1] = info.reserved[1];
  return CUDA_SUCCESS;
}

CUresult map_array(CUarrayMapInfo* infos, unsigned count, CUstream handle, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (infos == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
  // In parts of at most kMapArrayMaxOperations, in order on the stream; an error in a later
  // part leaves the earlier parts queued. An empty list is the driver's to answer.
  unsigned first = 0;
  do {
    const unsigned n = std::min(count - first, proto::kMapArrayMaxOperations);
    std::vector<proto::WireArrayMapInfo> wire(n);
    for (unsigned i = 0; i < n; ++i) {
      if (CUresult rc = wire_entry(infos[first + i], ctx, wire[i]); rc != CUDA_SUCCESS) return rc;
    }
    proto::MemMapArrayReq request{stream->wire, n, 0};
    if (CUresult rc = ctx->session->call(proto::Op::kMemMapArray, &request, sizeof request,
                                         std::as_bytes(std::span(wire)), nullptr, 0);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    first += n;
  } while (first < count);
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemMapArrayAsync(CUarrayMapInfo* mapInfoList, unsigned int count,
                                                   CUstream hStream) {
  return map_array(mapInfoList, count, hStream, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemMapArrayAsync_ptsz(CUarrayMapInfo* mapInfoList,
                                                        unsigned int count, CUstream hStream) {
  return map_array(mapInfoList, count, hStream, DefaultStream::kPerThread);
}

// The driver's smaller queries and settings that only the server's driver can answer
// (proto/ops_driver_extras.hpp; docs/cuda-runtime.md, "Smaller queries and settings"): a CUDA
// array's sparse properties and memory requirements, a dma-buf fd for the client's device memory
// (RDMA NICs register GPU memory so), resetting persisting L2 lines, flushing GPUDirect RDMA
// writes, and the device's 1D texture width and atomic capabilities. Whatever names memory must
// name the client's own.
#include <cstring>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/client_socket.hpp"
#include "proto/ops_driver_extras.hpp"
#include "proto/ops_graph_nodes.hpp"

namespace mpsshim::server {

namespace {

// A sparse-properties or memory-requirements query, answered by the driver's `sparse` and
// `requirements` calls (of a CUDA array or of a mipmapped array).
template <typename Sparse, typename Requirements>
OpResult answer_array_query(Call& call, std::uint32_t query, Sparse sparse,
                            Requirements requirements) {
  proto::ArrayQueryRep rep{};
  switch (static_cast<proto::ArrayQuery>(query)) {
    case proto::ArrayQuery::kSparseProperties: {
      CUDA_ARRAY_SPARSE_PROPERTIES p{};
      if (CUresult r = sparse(&p); r != CUDA_SUCCESS) return call.done(r);
      rep.tile_extent[0] = p.tileExtent.width;
      rep.tile_extent[1] = p.tileExtent.height;
      rep.tile_extent[2] = p.tileExtent.depth;
      rep.miptail_first_level = p.miptailFirstLevel;
      rep.size = p.miptailSize;
      rep.flags = p.flags;
      return call.reply(rep);
    }
    case proto::ArrayQuery::kMemoryRequirements: {
      CUDA_ARRAY_MEMORY_REQUIREMENTS m{};
      if (CUresult r = requirements(&m); r != CUDA_SUCCESS) return call.done(r);
      rep.size = m.size;
      rep.alignment = m.alignment;
      return call.reply(rep);
    }
  }
  return call.malformed(fmt::format("sent an array query of kind {}", query));
}

}  // namespace

OpResult op_array_query(Call& call) {
  auto req = call.request<proto::ArrayQueryReq>();
  const CUdevice device = call.session.gpu().device;
  if (req.mipmapped > 1) return call.malformed("sent an array query with mipmapped > 1");
  if (req.mipmapped == 1) {
    const MipmappedArrayObj* mipmap = call.session.objects.get<MipmappedArrayObj>(req.array);
    if (mipmap == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
    return answer_array_query(
        call, req.query,
        [&](CUDA_ARRAY_SPARSE_PROPERTIES* p) {
          return call.cu.cuMipmappedArrayGetSparseProperties(p, mipmap->mipmap);
        },
        [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* m) {
          return call.cu.cuMipmappedArrayGetMemoryRequirements(m, mipmap->mipmap, device);
        });
  }
  const ArrayObj* array = call.session.objects.get<ArrayObj>(req.array);
  if (array == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  return answer_array_query(
      call, req.query,
      [&](CUDA_ARRAY_SPARSE_PROPERTIES* p) {
        return call.cu.cuArrayGetSparseProperties(p, array->array);
      },
      [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* m) {
        return call.cu.cuArrayGetMemoryRequirements(m, array->array, device);
      });
}

OpResult op_mem_range_handle(Call& call) {
  auto req = call.request<proto::MemRangeHandleReq>();
  if (req.type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (req.bytes == 0 || !owns_memory(call, req.dptr, req.bytes)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  int fd = -1;
  if (CUresult r = call.cu.cuMemGetHandleForAddressRange(
          &fd, req.dptr, req.bytes, static_cast<CUmemRangeHandleType>(req.type), req.flags);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.done(send_memory_fd(call.session, proto::UniqueFd(fd), req.bytes));
}

OpResult op_driver_setting(Call& call) {
  auto req = call.request<proto::DriverSettingReq>();
  const DriverTable& cu = call.cu;
  const CUdevice device = call.session.gpu().device;
  std::uint64_t value = 0;
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  switch (static_cast<proto::DriverSetting>(req.setting)) {
    case proto::DriverSetting::kResetPersistingL2:
      // L2 is the GPU's: as for an MPS client, this resets every client's persisting lines.
      r = cu.cuCtxResetPersistingL2Cache();
      break;
    case proto::DriverSetting::kFlushRdmaWrites:
      r = cu.cuFlushGPUDirectRDMAWrites(static_cast<CUflushGPUDirectRDMAWritesTarget>(req.a),
                                        static_cast<CUflushGPUDirectRDMAWritesScope>(req.b));
      break;
    case proto::DriverSetting::kTexture1DLinearMaxWidth: {
      std::size_t width = 0;
      r = cu.cuDeviceGetTexture1DLinearMaxWidth(&width, static_cast<CUarray_format>(req.a),
                                                static_cast<unsigned>(req.b), device);
      value = width;
      break;
    }
    case proto::DriverSetting::kHostAtomicCapabilities: {
      const auto operation = static_cast<CUatomicOperation>(req.a);
      unsigned int caps = 0;
      r = cu.cuDeviceGetHostAtomicCapabilities(&caps, &operation, 1, device);
      value = caps;
      break;
    }
    case proto::DriverSetting::kP2PAtomicCapabilities: {
      const auto operation = static_cast<CUatomicOperation>(req.a);
      CUdevice peer = 0;
      if (req.b >= static_cast<std::uint64_t>(call.session.gpu().device_count)) break;
      if (r = cu.cuDeviceGet(&peer, static_cast<int>(req.b)); r != CUDA_SUCCESS) break;
      unsigned int caps = 0;
      r = cu.cuDeviceGetP2PAtomicCapabilities(&caps, &operation, 1, device, peer);
      value = caps;
      break;
    }
    default:
      return call.malformed(fmt::format("sent a driver setting of kind {}", req.setting));
  }
  if (r != CUDA_SUCCESS) return call.done(r);
  return call.reply(proto::GraphNodeValueRep{value});
}

}  // namespace mpsshim::server

// cuMemMapArrayAsync (proto/ops_sparse_array.hpp): tiles of the client's sparse CUDA arrays and
// mipmapped arrays mapped onto its tile-pool allocations (cuMemCreate with
// CU_MEM_CREATE_USAGE_TILE_POOL), or unmapped, in the client's stream order on its own stream.
// Every array, mipmapped array and allocation named must be the client's own; the driver checks
// the rest (tile alignment, the usage flag, the levels and layers, the mip tail).
//
// Accounting: an allocation's bytes are charged from cuMemCreate until the driver has it back.
// The driver keeps memory a tile maps until the tile is unmapped or its array destroyed, even
// after cuMemRelease, so each array holds every allocation its tiles were ever mapped onto
// (PhysicalAllocObj::mappings, once per array) until the array goes: a client cannot release a
// tile pool it still uses and have its bytes uncharged. Unmapping a tile does not end that hold
// (the server does not follow tiles); destroying the array does.
#include <algorithm>
#include <cstring>
#include <vector>

#include "broker/server/ops/ops.hpp"
#include "common/log.hpp"
#include "proto/ops_sparse_array.hpp"

namespace mpsshim::server {
namespace {

// A map names an allocation: the array (its `tile_pools`) will hold it.
struct Hold {
  std::vector<std::uint64_t>* pools;
  std::uint64_t allocation;
};

// The driver's entry for one wire entry, or the error to answer for the whole list.
CUresult driver_entry(Call& call, const proto::WireArrayMapInfo& w, CUarrayMapInfo& out,
                      std::vector<Hold>& holds) {
  Session& session = call.session;
  out = CUarrayMapInfo{};
  out.resourceType = static_cast<CUresourcetype>(w.resource_type);
  std::vector<std::uint64_t>* pools = nullptr;
  switch (w.resource_type) {
    case CU_RESOURCE_TYPE_ARRAY: {
      ArrayObj* array = session.objects.get<ArrayObj>(w.resource);
      if (array == nullptr) {
        note_not_owned(call, "a CUDA array");
        return CUDA_ERROR_INVALID_HANDLE;
      }
      // A level of a mipmapped array: the driver refuses it so, and its holds would be the
      // mipmapped array's.
      if (array->mipmap != 0) return CUDA_ERROR_INVALID_VALUE;
      out.resource.array = array->array;
      pools = &array->tile_pools;
      break;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      MipmappedArrayObj* mipmap = session.objects.get<MipmappedArrayObj>(w.resource);
      if (mipmap == nullptr) {
        note_not_owned(call, "a mipmapped array");
        return CUDA_ERROR_INVALID_HANDLE;
      }
      out.resource.mipmap = mipmap->mipmap;
      pools = &mipmap->tile_pools;
      break;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  out.subresourceType = static_cast<CUarraySparseSubresourceType>(w.subresource_type);
  if (w.subresource_type == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL) {
    out.subresource.miptail.layer = w.layer;
    out.subresource.miptail.offset = w.tail_offset;
    out.subresource.miptail.size = w.tail_bytes;
  } else {
    auto& level = out.subresource.sparseLevel;
    level.level = w.level;
    level.layer = w.layer;
    level.offsetX = w.offset_x;
    level.offsetY = w.offset_y;
    level.offsetZ = w.offset_z;
    level.extentWidth = w.extent_width;
    level.extentHeight = w.extent_height;
    level.extentDepth = w.extent_depth;
  }
  out.memOperationType = static_cast<CUmemOperationType>(w.operation);
  out.memHandleType = static_cast<CUmemHandleType>(w.handle_type);
  if (w.allocation != 0) {
    PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(w.allocation);
    if (allocation == nullptr || allocation->client_refs == 0) {
      note_not_owned(call, "a physical allocation");
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (allocation->bytes == PhysicalAllocObj::kImportedBytes) {
      // Its bytes are another client's, held open for this one while it maps them by address;
      // tiles would keep them past that open (docs/copies.md).
      log_warn(
          "{} mapped tiles of a sparse array onto an allocation imported from another "
          "process, which mpsshim does not serve (docs/copies.md)",
          session.who());
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    out.memHandle.memHandle = allocation->handle;
    if (w.operation == CU_MEM_OPERATION_TYPE_MAP) holds.push_back(Hold{pools, w.allocation});
  }
  out.offset = w.offset;
  out.deviceBitMask = w.device_mask == proto::kMapOnStreamDevice && session.gpu().device < 32
                          ? 1u << session.gpu().device
                          : 0u;
  out.flags = w.flags;
  out.reserved[0] = w.driver_reserved[0];
  out.reserved[1] = w.driver_reserved[1];
  return CUDA_SUCCESS;
}

}  // namespace

OpResult op_mem_map_array(Call& call) {
  auto req = call.request<proto::MemMapArrayReq>();
  if (req.count > proto::kMapArrayMaxOperations) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t bytes = std::uint64_t{req.count} * sizeof(proto::WireArrayMapInfo);
  if (!call.exact(sizeof req, bytes)) return call.malformed("array map list length");
  std::vector<proto::WireArrayMapInfo> wire(req.count);
  if (bytes != 0) std::memcpy(wire.data(), call.trailing(sizeof req, bytes).data(), bytes);
  std::vector<CUarrayMapInfo> infos(req.count);
  std::vector<Hold> holds;
  for (std::uint32_t i = 0; i < req.count; ++i) {
    if (CUresult r = driver_entry(call, wire[i], infos[i], holds); r != CUDA_SUCCESS) {
      return call.done(r);
    }
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  const CUresult r =
      call.cu.cuMemMapArrayAsync(infos.empty() ? nullptr : infos.data(), req.count, stream->stream);
  // Held even when the driver refused the list: it may have mapped some of it first, and a hold
  // too many only keeps bytes charged until the array goes.
  for (const Hold& hold : holds) {
    if (std::find(hold.pools->begin(), hold.pools->end(), hold.allocation) != hold.pools->end()) {
      continue;
    }
    hold.pools->push_back(hold.allocation);
    ++call.session.objects.get<PhysicalAllocObj>(hold.allocation)->mappings;
  }
  return finish_on_stream(call, *stream, r);
}

void drop_tile_pools(Session& session, const std::vector<std::uint64_t>& pools) {
  for (std::uint64_t id : pools) {
    if (PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(id)) {
      --allocation->mappings;
      release_if_unused(session, id);
    }
  }
}

}  // namespace mpsshim::server

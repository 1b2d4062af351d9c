// Stream-ordered allocation (cudaMallocAsync / cudaFreeAsync) and memory pools. Every pool is
// one of this process's own pools on the server of its device, never the device's shared
// default pool, and what it holds counts against this process's memory limit. A device's
// default pool is the session's default pool there (wire handle 0, made on first use); the
// current pool of a device is kept here and named in every allocation request.
#include <array>
#include <bit>
#include <mutex>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/graph_objects.hpp"
#include "libshim/ipc.hpp"
#include "libshim/object_pool.hpp"
#include "libshim/peer.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

struct DevicePools {
  std::mutex mutex;
  std::array<MemPool*, kMaxDevices> defaults{};              // made on first use, never freed
  std::array<std::atomic<MemPool*>, kMaxDevices> current{};  // nullptr: the default pool
};

DevicePools& device_pools() {
  static auto* pools = new DevicePools;
  return *pools;
}

CUresult default_pool(int device, MemPool*& out) {
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  if (device >= kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  DevicePools& pools = device_pools();
  std::lock_guard lock(pools.mutex);
  MemPool*& pool = pools.defaults[static_cast<std::size_t>(device)];
  if (pool == nullptr) pool = new MemPool{Magic::kMemPool, session, device, 0, true};
  out = pool;
  return CUDA_SUCCESS;
}

CUresult current_pool(int device, MemPool*& out) {
  if (device >= 0 && device < kMaxDevices) {
    if (MemPool* pool = device_pools().current[static_cast<std::size_t>(device)].load()) {
      out = pool;
      return CUDA_SUCCESS;
    }
  }
  return default_pool(device, out);
}

CUresult set_current_pool(int device, MemPool* pool) {
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  if (pool == nullptr || pool->device != device || device >= kMaxDevices) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  device_pools().current[static_cast<std::size_t>(device)].store(pool->is_default ? nullptr : pool);
  return CUDA_SUCCESS;
}

// Only device memory of one device exists behind mpsshim: no host or NUMA pools.
CUresult device_of(const CUmemLocation* location, const char* api, int& device) {
  if (location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    log_once(std::string(api) + ".location", LogLevel::kWarn,
             "{}: memory location type {} is not supported by mpsshim (only device memory, "
             "CU_MEM_LOCATION_TYPE_DEVICE); allocate pinned host memory with cuMemHostAlloc",
             api, static_cast<int>(location->type));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  device = location->id;
  return CUDA_SUCCESS;
}

CUresult alloc_from(MemPool* pool, CUdeviceptr* dptr, std::size_t bytes, CUstream handle,
                    DefaultStream mode) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (pool == nullptr) {
    if (CUresult rc = current_pool(ctx->device, pool); rc != CUDA_SUCCESS) return rc;
  }
  if (pool->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;
  proto::MemAllocAsyncReq request{pool->wire, stream->wire, bytes};
  proto::MemAllocRep reply{};
  if (CUresult rc = ctx->session->call(proto::Op::kMemAllocAsync, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  DeviceRange range{reply.dptr, bytes, ctx};
  range.pool = reinterpret_cast<CUmemoryPool>(pool);
  address_book().add_device(range);
  *dptr = reply.dptr;
  // In the server's arena like cuMemAlloc's memory: mapped into the GPUs that enabled peer
  // access to this one (nothing to do, without a lock, until one has), and into those the pool
  // gave access to.
  if (CUresult rc = share_with_peers(ctx->device, reply.dptr, bytes); rc != CUDA_SUCCESS) {
    return rc;
  }
  for (std::uint64_t peers = pool->peers.load(std::memory_order_acquire); peers != 0;
       peers &= peers - 1) {
    const int peer = std::countr_zero(peers);
    if (CUresult rc = reach_from(peer, reply.dptr, bytes); rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

CUresult free_async(CUdeviceptr dptr, CUstream handle, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (dptr == 0) return CUDA_SUCCESS;
  DeviceRange range{};
  if (!address_book().find_device(dptr, &range) || range.base != dptr || range.vmm) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Imported pool memory goes back to its exporter's server at once: its server frees nothing
  // of it before this client's queued work has run (docs/memory-pools.md).
  if (range.pool_import) return ipc_close_memory(range);
  if (range.ctx->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;
  // Other GPUs' servers that mapped it let go first, as for cuMemFree.
  forget_peer_blocks(ctx->device, range.base, range.bytes);
  proto::MemFreeAsyncReq request{dptr, stream->wire};
  CUresult rc = ctx->session->post(proto::Op::kMemFreeAsync, request);
  // After this returns the pointer is the stream's to free: its attributes are undefined.
  // Graph memory stays its graph's: the graph's next launch allocates it again.
  if (rc == CUDA_SUCCESS && !is_graph_memory(dptr)) address_book().remove_device(dptr, nullptr);
  return rc;
}

bool int_attribute(CUmemPool_attribute attribute) {
  return attribute == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
         attribute == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
         attribute == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

std::atomic<bool> g_ipc_logged{false};
std::atomic<bool> g_access_logged{false};

}  // namespace

// ---- stream-ordered allocation ----

#define MPSSHIM_ASYNC_ALLOC_ENTRIES(SUFFIX, MODE)                                             \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemAllocAsync##SUFFIX(CUdeviceptr* dptr, size_t bytes,    \
                                                          CUstream stream) {                  \
    if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;                           \
    return alloc_from(nullptr, dptr, bytes, stream, MODE);                                    \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync##SUFFIX(                            \
      CUdeviceptr* dptr, size_t bytes, CUmemoryPool hpool, CUstream stream) {                 \
    if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;                           \
    MemPool* pool = object_of<MemPool>(hpool);                                                \
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;                                     \
    return alloc_from(pool, dptr, bytes, stream, MODE);                                       \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemFreeAsync##SUFFIX(CUdeviceptr dptr, CUstream stream) { \
    return free_async(dptr, stream, MODE);                                                    \
  }

MPSSHIM_ASYNC_ALLOC_ENTRIES(, DefaultStream::kLegacy)
MPSSHIM_ASYNC_ALLOC_ENTRIES(_ptsz, DefaultStream::kPerThread)
#undef MPSSHIM_ASYNC_ALLOC_ENTRIES

// ---- the pools of a device ----

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* out, CUdevice device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemPool* pool = nullptr;
  if (CUresult rc = default_pool(device, pool); rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUmemoryPool>(pool);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* out, CUdevice device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemPool* pool = nullptr;
  if (CUresult rc = current_pool(device, pool); rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUmemoryPool>(pool);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  return set_current_pool(device, object_of<MemPool>(pool));
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool* out, CUmemLocation* location,
                                                       CUmemAllocationType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult rc = device_of(location, "cuMemGetDefaultMemPool", device); rc != CUDA_SUCCESS) {
    return rc;
  }
  return cuDeviceGetDefaultMemPool(out, device);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool* out, CUmemLocation* location,
                                                CUmemAllocationType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult rc = device_of(location, "cuMemGetMemPool", device); rc != CUDA_SUCCESS) return rc;
  return cuDeviceGetMemPool(out, device);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type,
                                                CUmemoryPool pool) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult rc = device_of(location, "cuMemSetMemPool", device); rc != CUDA_SUCCESS) return rc;
  return cuDeviceSetMemPool(device, pool);
}

// ---- pools ----

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* out, const CUmemPoolProps* props) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int device = 0;
  if (CUresult rc = device_of(&props->location, "cuMemPoolCreate", device); rc != CUDA_SUCCESS) {
    return rc;
  }
  if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    log_once(g_ipc_logged, LogLevel::kWarn,
             "cuMemPoolCreate: pools exported as handle types {:#x} are not supported by "
             "mpsshim (only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: docs/memory-pools.md)",
             static_cast<unsigned>(props->handleTypes));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) {
    return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
  }
  proto::MemPoolCreateReq request{props->maxSize, props->usage, 0};
  proto::MemPoolCreateRep reply{};
  if (CUresult rc = session->call(proto::Op::kMemPoolCreate, request, &reply); rc != CUDA_SUCCESS) {
    return rc;
  }
  MemPool* pool =
      ObjectPool<MemPool>::instance().make(Magic::kMemPool, session, device, reply.pool, false);
  if (props->handleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) make_exportable(*pool);
  *out = reinterpret_cast<CUmemoryPool>(pool);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool hpool) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (pool == nullptr || pool->is_default) return CUDA_ERROR_INVALID_VALUE;
  if (pool->imported) {  // nothing of it is on a server: its imports stay open until freed
    ObjectPool<MemPool>::instance().retire(pool);
    return CUDA_SUCCESS;
  }
  // A destroyed current pool leaves its device with the default pool, as the driver does.
  if (pool->device < kMaxDevices) {
    MemPool* expected = pool;
    device_pools().current[static_cast<std::size_t>(pool->device)].compare_exchange_strong(expected,
                                                                                           nullptr);
  }
  CUresult rc = pool->session->post(proto::Op::kMemPoolDestroy, proto::HandleReq{pool->wire});
  ObjectPool<MemPool>::instance().retire(pool);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool hpool,
                                                      CUmemPool_attribute attribute, void* value) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (pool == nullptr || value == nullptr || pool->imported) return CUDA_ERROR_INVALID_VALUE;
  proto::MemPoolAttributeReq request{pool->wire, static_cast<std::uint32_t>(attribute), 0, 0};
  request.value = int_attribute(attribute)
                      ? static_cast<std::uint32_t>(*static_cast<const int*>(value))
                      : *static_cast<const cuuint64_t*>(value);
  return pool->session->call(proto::Op::kMemPoolSetAttribute, request, static_cast<int*>(nullptr));
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool hpool,
                                                      CUmemPool_attribute attribute, void* value) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (pool == nullptr || value == nullptr || pool->imported) return CUDA_ERROR_INVALID_VALUE;
  proto::MemPoolAttributeReq request{pool->wire, static_cast<std::uint32_t>(attribute), 0, 0};
  proto::MemPoolAttributeRep reply{};
  CUresult rc = pool->session->call(proto::Op::kMemPoolGetAttribute, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  if (int_attribute(attribute)) {
    *static_cast<int*>(value) = static_cast<int>(static_cast<std::uint32_t>(reply.value));
  } else {
    *static_cast<cuuint64_t*>(value) = reply.value;
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool hpool, size_t keep_bytes) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (pool == nullptr || pool->imported) return CUDA_ERROR_INVALID_VALUE;
  return pool->session->post(proto::Op::kMemPoolTrimTo,
                             proto::MemPoolTrimReq{pool->wire, keep_bytes});
}

// A pool's memory is visible to its own device only (one device per mpsshim server).
MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool hpool, const CUmemAccessDesc* map,
                                                   size_t count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (pool == nullptr || (map == nullptr && count != 0)) return CUDA_ERROR_INVALID_VALUE;
  if (pool->imported) {
    // Its imports are opened on the exporter's GPU and mapped where they are opened: only the
    // pool's own device, read-write, is what an imported pool gives.
    for (size_t i = 0; i < count; ++i) {
      if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
          map[i].location.id != pool->device ||
          map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < count; ++i) {
    const int device = map[i].location.id;
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || device < 0 ||
        device >= visible_device_count() || device >= 64) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (device == pool->device && map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      continue;  // what the pool's own device always has
    }
    const bool read_write = map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((device == pool->device || !read_write) && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      log_once(g_access_logged, LogLevel::kWarn,
               "cuMemPoolSetAccess: read-only access is not supported by mpsshim (a pool's "
               "memory is read-write or not reachable)");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (device == pool->device) continue;
    // Another device: the pool's allocations from now on, and those alive now, are mapped into
    // its server (peer.hpp). Taking access away stops the mapping of new ones; what is mapped
    // stays until it is freed.
    const std::uint64_t bit = std::uint64_t{1} << device;
    if (!read_write) {
      pool->peers.fetch_and(~bit, std::memory_order_acq_rel);
      continue;
    }
    pool->peers.fetch_or(bit, std::memory_order_acq_rel);
    std::vector<DeviceRange> held;
    try {
      held = address_book().device_ranges();
    } catch (...) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (const DeviceRange& range : held) {
      if (range.pool != hpool) continue;
      if (CUresult rc = reach_from(device, range.base, range.bytes); rc != CUDA_SUCCESS) return rc;
    }
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool hpool,
                                                   CUmemLocation* location) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (pool == nullptr || flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const bool peer = location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id >= 0 &&
                    location->id < 64 &&
                    (pool->peers.load(std::memory_order_acquire) >> location->id & 1) != 0;
  *flags = (location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id == pool->device) || peer
               ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
               : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

// Stream-ordered allocation from memory pools. Memory comes from the device at the call (its
// address is valid at once, as the stream order only ever makes it valid later) and goes back in
// stream order. A pool keeps the accounting the attributes report: used and reserved bytes (freed
// memory stays reserved up to the release threshold, as the real allocator caches it) and their
// high watermarks; a maxSize bounds what it may hold.
#include <algorithm>
#include <memory>
#include <unordered_map>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

struct Pool {
  int device = 0;
  std::size_t max_size = 0;  // 0: the device's memory
  std::uint64_t used = 0;
  std::uint64_t used_high = 0;
  std::uint64_t reserved = 0;
  std::uint64_t reserved_high = 0;
  std::uint64_t release_threshold = 0;
  int reuse[3] = {1, 1, 1};
  bool destroyed = false;  // by cuMemPoolDestroy; gone once its allocations are freed
  std::size_t outstanding = 0;
};

struct Pools {
  std::unordered_map<CUmemoryPool, std::unique_ptr<Pool>> pools;
  std::unordered_map<std::uintptr_t, Pool*> owner;  // allocation base -> its pool
};

Pools& pools() {  // guarded by State::mutex; never destroyed (stream threads may run at exit)
  static Pools* const p = new Pools;
  return *p;
}

Pool* live_pool(CUmemoryPool handle) {
  auto it = pools().pools.find(handle);
  return it == pools().pools.end() || it->second->destroyed ? nullptr : it->second.get();
}

void shrink_to_threshold(Pool& pool) {
  pool.reserved = std::max(pool.used, std::min(pool.reserved, pool.release_threshold));
}

void erase_if_done(Pool* pool) {
  if (!pool->destroyed || pool->outstanding != 0) return;
  std::erase_if(pools().pools, [pool](const auto& kv) { return kv.second.get() == pool; });
}

}  // namespace

void forget_pool_allocation(State& s, std::uintptr_t base) {
  auto it = pools().owner.find(base);
  if (it == pools().owner.end()) return;
  Pool* pool = it->second;
  pools().owner.erase(it);
  auto a = s.allocations.find(base);
  if (a != s.allocations.end()) pool->used -= std::min<std::uint64_t>(pool->used, a->second.size);
  shrink_to_threshold(*pool);
  --pool->outstanding;
  erase_if_done(pool);
}

int live_pools(const State&) {
  return static_cast<int>(pools().pools.size());
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool,
                                                           const CUmemPoolProps* props) {
  return entry([&](State& s) {
    if (inject_failure("cuMemPoolCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(s, props->location.id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;
    auto p = std::make_unique<Pool>();
    p->device = props->location.id;
    p->max_size = props->maxSize;
    *pool = reinterpret_cast<CUmemoryPool>(p.get());
    pools().pools.emplace(*pool, std::move(p));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Pool* pool = live_pool(handle);
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    pool->destroyed = true;  // released when its last allocation is freed, as documented
    erase_if_done(pool);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool handle,
                                                                 CUmemPool_attribute attr,
                                                                 void* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Pool* pool = live_pool(handle);
    if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto u64 = *static_cast<const cuuint64_t*>(value);
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] =
            *static_cast<const int*>(value);
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->release_threshold = u64;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (u64 != 0) return CUDA_ERROR_INVALID_VALUE;  // only resettable
        pool->reserved_high = pool->reserved;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (u64 != 0) return CUDA_ERROR_INVALID_VALUE;
        pool->used_high = pool->used;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool handle,
                                                                 CUmemPool_attribute attr,
                                                                 void* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Pool* pool = live_pool(handle);
    if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto* u64 = static_cast<cuuint64_t*>(value);
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *static_cast<int*>(value) =
            pool->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *u64 = pool->release_threshold;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *u64 = pool->reserved;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *u64 = pool->reserved_high;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *u64 = pool->used;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *u64 = pool->used_high;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool handle,
                                                           size_t minBytesToKeep) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Pool* pool = live_pool(handle);
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    pool->reserved = std::max<std::uint64_t>(
        pool->used, std::min<std::uint64_t>(pool->reserved, minBytesToKeep));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr,
                                                                   size_t bytesize,
                                                                   CUmemoryPool handle,
                                                                   CUstream hstream) {
  return entry([&](State& s) {
    if (inject_failure("cuMemAllocFromPoolAsync")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    Pool* pool = live_pool(handle);
    if (pool == nullptr || dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (pool->device != stream->device) return CUDA_ERROR_INVALID_VALUE;
    if (pool->max_size != 0 && pool->used + bytesize > pool->max_size)
      return CUDA_ERROR_OUT_OF_MEMORY;
    Device& dev = *s.devices[static_cast<std::size_t>(pool->device)];
    if (CUresult r = allocate(s, dev, bytesize, true, dptr); r != CUDA_SUCCESS) return r;
    pools().owner.emplace(*dptr, pool);
    ++pool->outstanding;
    pool->used += bytesize;
    pool->used_high = std::max(pool->used_high, pool->used);
    pool->reserved = std::max(pool->reserved, pool->used);
    pool->reserved_high = std::max(pool->reserved_high, pool->reserved);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    auto it = s.allocations.find(dptr);
    // Graph memory: free for the graph's next launch from now on (stream order is not modelled:
    // the block is the graph's, and a launch after this free may allocate it again).
    if (it != s.allocations.end() && it->second.graph) {
      return free_graph_block(s, dptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    if (it == s.allocations.end() || !it->second.user) return CUDA_ERROR_INVALID_VALUE;
    // Freed when the stream gets there, with no copy or kernel running (memory_use).
    stream->queue->submit([&s, dptr] {
      std::unique_lock use(s.memory_use);
      std::lock_guard inner(s.mutex);
      release_allocation(s, dptr);
    });
    return CUDA_SUCCESS;
  });
}

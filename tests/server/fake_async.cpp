#include "tests/server/fake_async.hpp"

#include "tests/server/fake_driver.hpp"

namespace mpsshim::server::test {

FakeAsync& fake_async() {
  static FakeAsync state;
  return state;
}

namespace {
// The fake's cuMemAlloc: host memory that copies and memsets write through.
decltype(DriverTable::cuMemAlloc_v2) g_alloc = nullptr;
}  // namespace

void add_async_fakes(DriverTable& t) {
  fake_async().reset();
  g_alloc = t.cuMemAlloc_v2;
  t.cuLaunchHostFunc = [](CUstream stream, CUhostFn fn, void* user) {
    fake_async().host_work.push_back({stream, [fn, user](CUresult) { fn(user); }});
    return CUDA_SUCCESS;
  };
  t.cuStreamAddCallback = [](CUstream stream, CUstreamCallback fn, void* user, unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    fake_async().host_work.push_back(
        {stream, [fn, stream, user](CUresult status) { fn(stream, status, user); }});
    return CUDA_SUCCESS;
  };
  t.cuStreamIsCapturing = [](CUstream, CUstreamCaptureStatus* status) {
    *status = fake_async().capture;
    return CUDA_SUCCESS;
  };
  t.cuMemPoolCreate = [](CUmemoryPool* pool, const CUmemPoolProps* props) {
    static std::uintptr_t next = 0x7000;
    next += 0x10;
    *pool = reinterpret_cast<CUmemoryPool>(next);
    fake_async().pools[*pool] = FakeAsync::Pool{*props};
    ++fake_async().pools_live;
    return CUDA_SUCCESS;
  };
  t.cuMemPoolDestroy = [](CUmemoryPool pool) {
    auto it = fake_async().pools.find(pool);
    if (it == fake_async().pools.end() || it->second.destroyed) return CUDA_ERROR_INVALID_VALUE;
    it->second.destroyed = true;
    --fake_async().pools_live;
    return CUDA_SUCCESS;
  };
  t.cuMemPoolSetAttribute = [](CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
    auto it = fake_async().pools.find(pool);
    if (it == fake_async().pools.end()) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
      it->second.release_threshold = *static_cast<cuuint64_t*>(value);
    return CUDA_SUCCESS;
  };
  t.cuMemPoolGetAttribute = [](CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
    auto it = fake_async().pools.find(pool);
    if (it == fake_async().pools.end()) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *static_cast<cuuint64_t*>(value) = it->second.release_threshold;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *static_cast<cuuint64_t*>(value) = it->second.used;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        *static_cast<int*>(value) = 1;
        return CUDA_SUCCESS;
      // The other int attributes: an int is all the caller gave (fuzz_ring_records found the
      // 8-byte write this default made).
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *static_cast<int*>(value) = 1;
        return CUDA_SUCCESS;
      default:
        *static_cast<cuuint64_t*>(value) = 0;
        return CUDA_SUCCESS;
    }
  };
  t.cuMemPoolTrimTo = [](CUmemoryPool, std::size_t) { return CUDA_SUCCESS; };
  t.cuMemAllocFromPoolAsync = [](CUdeviceptr* p, std::size_t bytes, CUmemoryPool pool, CUstream) {
    auto it = fake_async().pools.find(pool);
    if (it == fake_async().pools.end() || it->second.destroyed) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.props.maxSize != 0 && it->second.used + bytes > it->second.props.maxSize)
      return CUDA_ERROR_OUT_OF_MEMORY;
    if (CUresult r = g_alloc(p, bytes); r != CUDA_SUCCESS) return r;
    it->second.used += bytes;
    fake_async().pool_of[*p] = pool;
    return CUDA_SUCCESS;
  };
  t.cuMemFreeAsync = [](CUdeviceptr p, CUstream) {
    auto it = fake_async().pool_of.find(p);
    if (it == fake_async().pool_of.end()) return CUDA_ERROR_INVALID_VALUE;
    ++fake_async().frees_async;
    fake_async().pools[it->second].used = 0;
    fake_async().pool_of.erase(it);
    return fake_gpu().allocations.erase(p) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
}

}  // namespace mpsshim::server::test

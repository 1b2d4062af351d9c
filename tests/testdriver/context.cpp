// Primary contexts: their lifetime, the calling thread's current context, limits.
#include <utility>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

std::array<std::size_t, CU_LIMIT_MAX> default_limits() {
  std::array<std::size_t, CU_LIMIT_MAX> l{};
  l[CU_LIMIT_STACK_SIZE] = 1024;
  l[CU_LIMIT_PRINTF_FIFO_SIZE] = std::size_t{1} << 20;
  l[CU_LIMIT_MALLOC_HEAP_SIZE] = std::size_t{8} << 20;
  l[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
  l[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 32;
  l[CU_LIMIT_SHMEM_SIZE] = kSharedPerBlockOptin;
  return l;
}

void activate(Device& dev) {
  static const auto all_sms =
      std::make_shared<const std::vector<std::uint16_t>>(SmSet::all().ids());
  dev.primary.limits = default_limits();
  dev.primary.null_stream = std::make_unique<Stream>(Stream{
      dev.ordinal, dev.handle(), nullptr, all_sms, 0, kStreamPriorityLeast, WorkQueue::start()});
}

// Everything created in the context goes with it (registrations are process-wide here, as if
// every range were CU_MEMHOSTREGISTER_PORTABLE). Locked, memory_use held exclusively.
void teardown(State& s, Device& dev) {
  const int d = dev.ordinal;
  retire_stream(s, *dev.primary.null_stream);
  dev.primary.null_stream.reset();
  for (const auto& [handle, stream] : s.streams)
    if (stream->device == d) retire_stream(s, *stream);
  s.streams.erase_if([d](const Stream& st) { return st.device == d; });
  s.events.erase_if([d](const Event& e) { return e.device() == d; });
  std::vector<CUmodule> doomed;
  for (const auto& [handle, m] : s.modules)
    if (m->device == d) doomed.push_back(handle);
  for (CUmodule m : doomed) {
    if (Library* lib = s.modules.get(m)->library)
      lib->modules[static_cast<std::size_t>(d)] = nullptr;
    destroy_module(s, m);
  }
  std::vector<std::uintptr_t> bases;
  for (const auto& [base, a] : s.allocations)
    if (a.device == d) bases.push_back(base);
  for (std::uintptr_t base : bases) release_allocation(s, base);
}

}  // namespace

CUresult retain_primary(State&, Device& dev) {
  if (dev.primary.refcount++ == 0) activate(dev);
  return CUDA_SUCCESS;
}

CUresult release_primary(State& s, Device& dev, std::unique_lock<std::mutex>& lock) {
  if (!dev.primary.active()) return CUDA_ERROR_INVALID_CONTEXT;
  if (--dev.primary.refcount > 0) return CUDA_SUCCESS;
  lock.unlock();
  drain(s, dev.ordinal);
  std::unique_lock use(s.memory_use);
  lock.lock();
  if (!dev.primary.active() && dev.primary.null_stream) teardown(s, dev);  // unless re-retained
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    Device& d = *s.devices[static_cast<std::size_t>(dev)];
    retain_primary(s, d);
    *pctx = d.handle();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    return release_primary(s, *s.devices[static_cast<std::size_t>(dev)], lock);
  });
}

// A primary context while retained, or a green context's CUcontext while it lives.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (ctx != nullptr && context_of(s, ctx).device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    set_current_context(ctx);
    return CUDA_SUCCESS;
  });
}

// Waits for the current context's work: a green context's own, or a primary context's device.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxSynchronize() {
  return entry([&](State& s) {
    CUcontext ctx = nullptr;
    {
      std::lock_guard lock(s.mutex);
      ctx = current_context(s).handle;
    }
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    drain_context(s, ctx);
    return s.sticky.load();  // a fault while waiting is this call's error too
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    switch (limit) {
      case CU_LIMIT_STACK_SIZE:
      case CU_LIMIT_PRINTF_FIFO_SIZE:
      case CU_LIMIT_MALLOC_HEAP_SIZE:
      case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
      case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
        break;
      case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
        if (value > 128) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:  // not on compute capability 9.0
      case CU_LIMIT_SHMEM_SIZE:              // query-only, and this is not a CIG context
      case CU_LIMIT_CIG_ENABLED:
      case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    dev->primary.limits[limit] = value;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (pvalue == nullptr || static_cast<unsigned>(limit) >= CU_LIMIT_MAX)
      return CUDA_ERROR_INVALID_VALUE;
    if (limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    *pvalue = dev->primary.limits[limit];
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  return entry([&](State&) {
    if (least != nullptr) *least = kStreamPriorityLeast;
    if (greatest != nullptr) *greatest = kStreamPriorityGreatest;
    return CUDA_SUCCESS;
  });
}

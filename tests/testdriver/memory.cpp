// Device allocations and registered (page-locked) host memory.
#include <algorithm>
#include <cstring>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr std::size_t kPitchAlignment = 512;
constexpr unsigned kRegisterFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                    CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

bool overlaps(std::uintptr_t a, std::size_t a_len, std::uintptr_t b, std::size_t b_len) {
  return a < b + b_len && b < a + a_len;
}

// Freeing waits for all queued work first (cuMemFree synchronizes), then unmaps with no copy or
// kernel running. `still_valid` rechecks under the lock, since the lock was dropped to drain.
template <class StillValid, class Release>
CUresult release_synchronized(State& s, StillValid still_valid, Release release) {
  drain(s, -1);
  std::unique_lock use(s.memory_use);
  std::lock_guard lock(s.mutex);
  if (CUresult r = still_valid(); r != CUDA_SUCCESS) return r;
  release();
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return entry([&](State& s) {
    if (inject_failure("cuMemAlloc_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return allocate(s, *dev, bytesize, true, dptr);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                                              size_t width, size_t height,
                                                              unsigned int elementSize) {
  return entry([&](State& s) {
    if (inject_failure("cuMemAllocPitch_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (dptr == nullptr || pPitch == nullptr || width == 0 || height == 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (elementSize != 4 && elementSize != 8 && elementSize != 16) return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX - kPitchAlignment) return CUDA_ERROR_OUT_OF_MEMORY;
    const std::size_t pitch = (width + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
    if (height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    if (CUresult r = allocate(s, *dev, pitch * height, true, dptr); r != CUDA_SUCCESS) return r;
    *pPitch = pitch;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return entry([&](State& s) {
    {
      // Graph memory: the block stays the graph's; it is free for the graph's next launch.
      std::lock_guard lock(s.mutex);
      auto it = s.allocations.find(dptr);
      if (it != s.allocations.end() && it->second.graph) {
        return free_graph_block(s, dptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      }
    }
    auto known = [&] {
      auto it = s.allocations.find(dptr);
      return it != s.allocations.end() && it->second.user ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    };
    {
      std::lock_guard lock(s.mutex);
      if (CUresult r = known(); r != CUDA_SUCCESS) return r;
    }
    return release_synchronized(s, known, [&] { release_allocation(s, dptr); });
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *total = dev->memory.size();
    const std::size_t used =
        dev->memory.used() + s.vmm.physical_bytes[static_cast<std::size_t>(dev->ordinal)];
    *free = dev->memory.size() - std::min(dev->memory.size(), used);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize,
                                                                unsigned int Flags) {
  return entry([&](State& s) {
    if (inject_failure("cuMemHostRegister_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (current_device(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (p == nullptr || bytesize == 0 || (Flags & ~kRegisterFlags) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    if (base + bytesize < base) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& [b, r] : s.registrations)
      if (overlaps(base, bytesize, b, r.size)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    // Device memory is not host memory: a device pointer cannot be page-locked.
    for (const auto& [b, a] : s.allocations)
      if (overlaps(base, bytesize, b, a.size)) return CUDA_ERROR_INVALID_VALUE;
    s.registrations.emplace(base, Registration{bytesize, Flags});
    return CUDA_SUCCESS;
  });
}

// Work still queued on the range faults when it runs, as DMA to unpinned memory would; a copy
// running right now finishes first.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
  return entry([&](State& s) {
    std::unique_lock use(s.memory_use);
    std::lock_guard lock(s.mutex);
    if (current_device(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (s.registrations.erase(reinterpret_cast<std::uintptr_t>(p)) == 0)
      return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p,
                                                                        unsigned int Flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (current_device(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    auto it = s.registrations.upper_bound(addr);
    if (it == s.registrations.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    if (addr >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = addr;  // unified addressing: the device sees the range at its host address
    return CUDA_SUCCESS;
  });
}

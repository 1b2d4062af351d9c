// cuMemHostRegister / cuMemHostUnregister. The server cannot map arbitrary client memory (a
// malloc'd heap is private to the client process), so a registration is recorded here and
// nothing is sent: copies from and to a registered range take the pageable path (staged
// through the session's chunks), which gives the same results with pageable-copy speed. The
// device cannot address the range: cuMemHostGetDevicePointer on it is refused, as the driver
// documents for devices without mapped pinned memory (the DEVICEMAP flag is accepted and the
// failure deferred to cuMemHostGetDevicePointer). See docs/host-memory.md.
#include <cstdint>
#include <limits>
#include <map>
#include <shared_mutex>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/host_memory.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)

namespace {

constexpr unsigned kKnownFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                 CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

class Registry {
 public:
  // False when [base, base + bytes) overlaps a registered range.
  bool add(const RegisteredRange& range) {
    std::unique_lock lock(mutex_);
    auto next = ranges_.lower_bound(range.base);
    if (next != ranges_.end() && next->first < range.base + range.bytes) return false;
    if (next != ranges_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second.bytes > range.base) return false;
    }
    ranges_.emplace(range.base, range);
    return true;
  }

  bool remove(std::uintptr_t base) {
    std::unique_lock lock(mutex_);
    return ranges_.erase(base) == 1;
  }

  bool find(std::uintptr_t address, RegisteredRange* out) const {
    std::shared_lock lock(mutex_);
    auto it = ranges_.upper_bound(address);
    if (it == ranges_.begin()) return false;
    --it;
    if (address - it->first >= it->second.bytes) return false;
    if (out != nullptr) *out = it->second;
    return true;
  }

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::uintptr_t, RegisteredRange> ranges_;
};

// Never destroyed: entry points may run from other libraries' exit handlers.
Registry& registry() noexcept {
  static Registry* instance = new Registry;
  return *instance;
}

bool overlaps_pinned(std::uintptr_t base, std::uint64_t bytes) {
  return address_book().find_pinned(reinterpret_cast<void*>(base), nullptr) ||
         address_book().find_pinned(reinterpret_cast<void*>(base + bytes - 1), nullptr);
}

CUresult host_register(void* p, size_t bytes, unsigned flags) noexcept {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (p == nullptr || bytes == 0 || (flags & ~kKnownFlags) != 0 ||
      bytes > std::numeric_limits<std::uintptr_t>::max() - base) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) {
    static constinit std::atomic<bool> logged{false};
    log_once(logged, LogLevel::kWarn,
             "cuMemHostRegister(CU_MEMHOSTREGISTER_IOMEMORY): the GPU server cannot map another "
             "device's I/O memory from this process; returning CUDA_ERROR_NOT_SUPPORTED");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (overlaps_pinned(base, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  try {
    if (!registry().add({base, bytes, flags, ctx->device})) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  } catch (...) {  // allocation failure
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  static constinit std::atomic<bool> logged{false};
  log_once(logged, LogLevel::kInfo,
           "cuMemHostRegister: registered host memory is not page-locked for the GPU under "
           "mpsshim (the server cannot map this process's private memory); copies from and to "
           "it are staged like pageable copies and the device cannot address it. Allocate with "
           "cudaHostAlloc / cuMemHostAlloc for zero-copy transfers and device mapping");
  return CUDA_SUCCESS;
}

}  // namespace

namespace mpsshim::shim {

bool find_registered(const void* address, RegisteredRange* out) noexcept {
  return registry().find(reinterpret_cast<std::uintptr_t>(address), out);
}

CUresult registered_device_pointer_refused() noexcept {
  static constinit std::atomic<bool> logged{false};
  log_once(logged, LogLevel::kWarn,
           "cuMemHostGetDevicePointer on memory registered with cuMemHostRegister: the GPU "
           "server cannot map this process's private memory, so the device cannot address it; "
           "returning CUDA_ERROR_NOT_SUPPORTED. Use cudaHostAlloc(cudaHostAllocMapped) / "
           "cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP) for memory the device reads or writes");
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace mpsshim::shim

MPSSHIM_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags) {
  return host_register(p, bytes, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  return host_register(p, bytes, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only the base address given to cuMemHostRegister unregisters, as with the driver.
  if (!registry().remove(reinterpret_cast<std::uintptr_t>(p))) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  return CUDA_SUCCESS;
}

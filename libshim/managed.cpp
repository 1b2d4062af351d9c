// Managed (unified) memory: cuMemAllocManaged gives pinned host memory that the server maps for
// the device at the same address (allocate_pinned, memory.cpp), answered as managed. The client
// process has no GPU mapping of its own, so nothing can migrate pages between it and the device;
// instead the pages stay in host memory, which the CPU and the GPU may both touch at any time
// (coherently, as concurrentManagedAccess promises), and kernels reach them over the host link.
// Advice and prefetches are validated and recorded page by page (managed_advice.hpp), so the
// range attributes answer what the program set, but move nothing. See docs/host-memory.md.
#include <array>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/host_memory.hpp"
#include "libshim/managed_advice.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)

namespace {

constexpr int kDeviceCpu = -1;      // CU_DEVICE_CPU
constexpr int kDeviceInvalid = -2;  // CU_DEVICE_INVALID

// The managed allocation holding all of [address, address + bytes), if there is one.
bool find_managed(CUdeviceptr address, std::size_t bytes, PinnedRange* out) {
  PinnedRange range{};
  if (bytes == 0 || !address_book().find_pinned(reinterpret_cast<const void*>(address), &range) ||
      !range.managed) {
    return false;
  }
  const std::uint64_t offset = address - reinterpret_cast<std::uint64_t>(range.base);
  if (offset >= range.requested || bytes > range.requested - offset) return false;
  if (out) *out = range;
  return true;
}

std::uint64_t base_of(const PinnedRange& range) {
  return reinterpret_cast<std::uint64_t>(range.base);
}

// A location as cuMemAdvise_v2 and cuMemPrefetchAsync_v2 name one.
CUresult location_of(const CUmemLocation& in, Location& out) {
  switch (in.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (device_snapshot(in.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
      out = {CU_MEM_LOCATION_TYPE_DEVICE, in.id};
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      out = {CU_MEM_LOCATION_TYPE_HOST, 0};
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (in.id < 0) return CUDA_ERROR_INVALID_VALUE;
      out = {CU_MEM_LOCATION_TYPE_HOST_NUMA, in.id};
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// The same from the legacy calls' CUdevice, where CU_DEVICE_CPU names the host.
CUresult location_of(CUdevice device, Location& out) {
  if (device == kDeviceCpu) {
    out = {CU_MEM_LOCATION_TYPE_HOST, 0};
    return CUDA_SUCCESS;
  }
  return location_of(CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, device}, out);
}

// A location as the legacy int attributes report it.
int legacy_id(const Location& location) {
  switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return location.id;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      return kDeviceCpu;
    default:
      return kDeviceInvalid;
  }
}

std::uint64_t accessor_bit(const Location& location) {
  if (location.type == CU_MEM_LOCATION_TYPE_DEVICE && location.id >= 0 && location.id < 63) {
    return std::uint64_t{1} << location.id;
  }
  return kHostBit;
}

CUresult advise(CUdeviceptr address, std::size_t bytes, CUmem_advise advice, CUresult location_rc,
                const Location& location) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  PinnedRange range{};
  if (!find_managed(address, bytes, &range)) return CUDA_ERROR_INVALID_VALUE;
  const bool needs_location = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION ||
                              advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
                              advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY;
  if (needs_location && location_rc != CUDA_SUCCESS) return location_rc;
  std::function<void(PageAdvice&)> change;
  switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
      change = [](PageAdvice& a) { a.read_mostly = true; };
      break;
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
      change = [](PageAdvice& a) { a.read_mostly = false; };
      break;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
      change = [location](PageAdvice& a) { a.preferred = location; };
      break;
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
      change = [](PageAdvice& a) { a.preferred = Location{}; };
      break;
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
      change = [bit = accessor_bit(location)](PageAdvice& a) { a.accessed_by |= bit; };
      break;
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
      change = [bit = accessor_bit(location)](PageAdvice& a) { a.accessed_by &= ~bit; };
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  managed_advice().update(base_of(range), address, bytes, change);
  return CUDA_SUCCESS;
}

// A prefetch moves nothing (the pages stay where both processors reach them): it is checked as
// the driver checks it, ordered on nothing, and remembered for LAST_PREFETCH_LOCATION.
CUresult prefetch(CUdeviceptr address, std::size_t bytes, const Location& location, CUstream handle,
                  DefaultStream mode) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  PinnedRange range{};
  if (!find_managed(address, bytes, &range)) return CUDA_ERROR_INVALID_VALUE;
  managed_advice().update(base_of(range), address, bytes,
                          [location](PageAdvice& a) { a.last_prefetch = location; });
  return CUDA_SUCCESS;
}

CUresult prefetch_legacy(CUdeviceptr address, std::size_t bytes, CUdevice device, CUstream stream,
                         DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Location location{};
  if (CUresult rc = location_of(device, location); rc != CUDA_SUCCESS) return rc;
  return prefetch(address, bytes, location, stream, mode);
}

CUresult prefetch_v2(CUdeviceptr address, std::size_t bytes, CUmemLocation where,
                     unsigned int flags, CUstream stream, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Location location{};
  if (CUresult rc = location_of(where, location); rc != CUDA_SUCCESS) return rc;
  return prefetch(address, bytes, location, stream, mode);
}

CUresult range_attribute(void* data, std::size_t data_bytes, CUmem_range_attribute attribute,
                         CUdeviceptr address, std::size_t bytes) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  PinnedRange range{};
  if (!find_managed(address, bytes, &range)) return CUDA_ERROR_INVALID_VALUE;
  const PageAdvice advice = managed_advice().combined(base_of(range), address, bytes);
  auto* out = static_cast<int*>(data);
  if (attribute == CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY) {
    if (data_bytes == 0 || data_bytes % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t slots = data_bytes / 4;
    std::size_t filled = 0;
    for (int d = 0; d < 63 && filled < slots; ++d) {
      if ((advice.accessed_by >> d) & 1) out[filled++] = d;
    }
    if ((advice.accessed_by & kHostBit) != 0 && filled < slots) out[filled++] = kDeviceCpu;
    while (filled < slots) out[filled++] = kDeviceInvalid;
    return CUDA_SUCCESS;
  }
  if (data_bytes != 4) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
      *out = advice.read_mostly ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
      *out = legacy_id(advice.preferred);
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
      *out = legacy_id(advice.last_prefetch);
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
      *out = advice.preferred.type;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
      *out = advice.preferred.id;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
      *out = advice.last_prefetch.type;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
      *out = advice.last_prefetch.id;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// The batch calls: every range must be managed; each prefetch location applies from its index
// in `first_of` up to the next one's.
CUresult batch(CUdeviceptr* addresses, size_t* sizes, size_t count, CUmemLocation* locations,
               size_t* first_of, size_t location_count, unsigned long long flags, CUstream handle,
               DefaultStream mode, bool prefetches) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  // The legacy NULL stream is not allowed (the per-thread one is).
  if (addresses == nullptr || sizes == nullptr || count == 0 || flags != 0 ||
      handle == CU_STREAM_LEGACY || (handle == nullptr && mode == DefaultStream::kLegacy)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) {
    return rc;
  }
  std::vector<Location> where;
  if (prefetches) {
    if (locations == nullptr || first_of == nullptr || location_count == 0 ||
        location_count > count || first_of[0] != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    where.resize(count);
    for (size_t k = 0; k < location_count; ++k) {
      const size_t end = k + 1 < location_count ? first_of[k + 1] : count;
      if (end <= first_of[k] || end > count) return CUDA_ERROR_INVALID_VALUE;
      Location location{};
      if (CUresult rc = location_of(locations[k], location); rc != CUDA_SUCCESS) return rc;
      for (size_t i = first_of[k]; i < end; ++i) where[i] = location;
    }
  }
  std::vector<PinnedRange> ranges(count);
  for (size_t i = 0; i < count; ++i) {
    if (!find_managed(addresses[i], sizes[i], &ranges[i])) return CUDA_ERROR_INVALID_VALUE;
  }
  // A discard leaves the pages' contents as they are, which "indeterminate" allows.
  if (prefetches) {
    for (size_t i = 0; i < count; ++i) {
      managed_advice().update(base_of(ranges[i]), addresses[i], sizes[i],
                              [l = where[i]](PageAdvice& a) { a.last_prefetch = l; });
    }
  }
  return CUDA_SUCCESS;
}

CUresult attach(CUstream handle, CUdeviceptr address, size_t bytes, unsigned int flags,
                DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST &&
      flags != CU_MEM_ATTACH_SINGLE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  PinnedRange range{};
  if (!find_managed(address, 1, &range)) return CUDA_ERROR_INVALID_VALUE;
  // Length 0 means the whole allocation; any other length must be exactly that.
  if (bytes != 0 && (address != base_of(range) || bytes != range.requested)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Every page is reachable from every stream and the host at all times: nothing to attach.
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes,
                                                  unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || bytes == 0 ||
      (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  void* pointer = nullptr;
  CUresult rc =
      allocate_pinned(&pointer, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP, true);
  if (rc != CUDA_SUCCESS) return rc;
  // Managed memory has one pointer for both processors: the server must have mapped it at the
  // address this process did (it does whenever the pinned window is reserved).
  PinnedRange range{};
  if (!address_book().find_pinned(pointer, &range) ||
      range.device_pointer != reinterpret_cast<std::uint64_t>(pointer)) {
    if (range.base != nullptr) free_pinned(range);
    log_once("cuMemAllocManaged.address", LogLevel::kWarn,
             "cuMemAllocManaged: the server could not map the memory at this process's address "
             "(no pinned window: MPSSHIM_ADDRESS_ARENA=off?); returning CUDA_ERROR_OUT_OF_MEMORY");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  log_once("cuMemAllocManaged", LogLevel::kInfo,
           "cuMemAllocManaged: managed memory under mpsshim is host memory the device maps "
           "(it does not migrate; kernels reach it over the host link): docs/host-memory.md");
  *dptr = reinterpret_cast<CUdeviceptr>(pointer);
  managed_advice().add(*dptr, bytes);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAdvise(CUdeviceptr address, size_t bytes, CUmem_advise advice,
                                            CUdevice device) {
  Location location{};
  const CUresult location_rc = location_of(device, location);
  return advise(address, bytes, advice, location_rc, location);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr address, size_t bytes,
                                               CUmem_advise advice, CUmemLocation where) {
  Location location{};
  const CUresult location_rc = location_of(where, location);
  return advise(address, bytes, advice, location_rc, location);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr address, size_t bytes,
                                                   CUdevice device, CUstream stream) {
  return prefetch_legacy(address, bytes, device, stream, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr address, size_t bytes,
                                                        CUdevice device, CUstream stream) {
  return prefetch_legacy(address, bytes, device, stream, DefaultStream::kPerThread);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr address, size_t bytes,
                                                      CUmemLocation where, unsigned int flags,
                                                      CUstream stream) {
  return prefetch_v2(address, bytes, where, flags, stream, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr address, size_t bytes,
                                                           CUmemLocation where, unsigned int flags,
                                                           CUstream stream) {
  return prefetch_v2(address, bytes, where, flags, stream, DefaultStream::kPerThread);
}

#define MPSSHIM_MANAGED_BATCH(SUFFIX, MODE)                                                   \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchBatchAsync##SUFFIX(                            \
      CUdeviceptr* addresses, size_t* sizes, size_t count, CUmemLocation* locations,          \
      size_t* first_of, size_t location_count, unsigned long long flags, CUstream stream) {   \
    return batch(addresses, sizes, count, locations, first_of, location_count, flags, stream, \
                 MODE, true);                                                                 \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemDiscardBatchAsync##SUFFIX(                             \
      CUdeviceptr* addresses, size_t* sizes, size_t count, unsigned long long flags,          \
      CUstream stream) {                                                                      \
    return batch(addresses, sizes, count, nullptr, nullptr, 0, flags, stream, MODE, false);   \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync##SUFFIX(                  \
      CUdeviceptr* addresses, size_t* sizes, size_t count, CUmemLocation* locations,          \
      size_t* first_of, size_t location_count, unsigned long long flags, CUstream stream) {   \
    return batch(addresses, sizes, count, locations, first_of, location_count, flags, stream, \
                 MODE, true);                                                                 \
  }
MPSSHIM_MANAGED_BATCH(, DefaultStream::kLegacy)
MPSSHIM_MANAGED_BATCH(_ptsz, DefaultStream::kPerThread)
#undef MPSSHIM_MANAGED_BATCH

MPSSHIM_EXPORT CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t data_bytes,
                                                       CUmem_range_attribute attribute,
                                                       CUdeviceptr address, size_t bytes) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  return range_attribute(data, data_bytes, attribute, address, bytes);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemRangeGetAttributes(void** data, size_t* data_bytes,
                                                        CUmem_range_attribute* attributes,
                                                        size_t count, CUdeviceptr address,
                                                        size_t bytes) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (data == nullptr || data_bytes == nullptr || attributes == nullptr || count == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < count; ++i) {
    if (CUresult rc = range_attribute(data[i], data_bytes[i], attributes[i], address, bytes);
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync(CUstream stream, CUdeviceptr address,
                                                       size_t bytes, unsigned int flags) {
  return attach(stream, address, bytes, flags, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream stream, CUdeviceptr address,
                                                            size_t bytes, unsigned int flags) {
  return attach(stream, address, bytes, flags, DefaultStream::kPerThread);
}

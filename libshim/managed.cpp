// Managed (unified) memory is not offered under mpsshim: the client process has no GPU mapping
// of its own, so the device cannot page the client's memory in and out, and the host cannot
// touch device memory. cuMemAllocManaged and the calls that only make sense on managed ranges
// return CUDA_ERROR_NOT_SUPPORTED with a log line, and the device attributes that advertise
// managed memory read 0 (device.cpp), so programs that check them take their explicit-copy
// path. See docs/host-memory.md.
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/log.hpp"

using namespace mpsshim::shim;

namespace {

CUresult managed_not_supported(const char* call) noexcept {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  log_once(call, Level::warn,
           "{}: managed memory is not supported under mpsshim (the client process has no GPU "
           "mapping of its own, so the device cannot page this process's memory); returning "
           "CUDA_ERROR_NOT_SUPPORTED. Use cudaMalloc with explicit copies, or cudaMallocHost / "
           "cudaHostAlloc for memory both the host and the device touch",
           call);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t, unsigned int) {
  if (dptr != nullptr) *dptr = 0;
  return managed_not_supported("cuMemAllocManaged");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice) {
  return managed_not_supported("cuMemAdvise");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr, size_t, CUmem_advise, CUmemLocation) {
  return managed_not_supported("cuMemAdvise");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr, size_t, CUdevice, CUstream) {
  return managed_not_supported("cuMemPrefetchAsync");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr, size_t, CUdevice, CUstream) {
  return managed_not_supported("cuMemPrefetchAsync");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr, size_t, CUmemLocation,
                                                      unsigned int, CUstream) {
  return managed_not_supported("cuMemPrefetchAsync");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr, size_t, CUmemLocation,
                                                           unsigned int, CUstream) {
  return managed_not_supported("cuMemPrefetchAsync");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemRangeGetAttribute(void*, size_t, CUmem_range_attribute,
                                                       CUdeviceptr, size_t) {
  return managed_not_supported("cuMemRangeGetAttribute");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemRangeGetAttributes(void**, size_t*, CUmem_range_attribute*,
                                                        size_t, CUdeviceptr, size_t) {
  return managed_not_supported("cuMemRangeGetAttributes");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync(CUstream, CUdeviceptr, size_t,
                                                       unsigned int) {
  return managed_not_supported("cuStreamAttachMemAsync");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream, CUdeviceptr, size_t,
                                                            unsigned int) {
  return managed_not_supported("cuStreamAttachMemAsync");
}

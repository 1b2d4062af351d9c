// The driver's smaller queries and settings in the test driver: a deferred-mapping array's
// memory requirements, dma-buf handles for device memory (a memfd here), persisting L2,
// GPUDirect RDMA flushes, the 1D texture width and atomic capabilities. The checks are the real
// driver's (cuda.h); the figures are the test driver's own, which tests compare end to end.
#include <sys/mman.h>
#include <unistd.h>

#include "tests/testdriver/state.hpp"

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* out, CUarray handle, CUdevice device) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Array* a = s.arrays.get(handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (out == nullptr || a->device != device ||
        (a->desc.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    constexpr std::size_t kAlignment = 64u << 10;  // an H200's, for a 64 x 64 float array
    const std::size_t bytes = a->row() * a->rows() * a->slices();
    *out = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
    out->size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    out->alignment = kAlignment;
    return CUDA_SUCCESS;
  });
}

// A dma-buf of device memory: page-aligned, inside one allocation. Here a memfd of that size
// stands for it (no NIC reads it).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemGetHandleForAddressRange(void* handle,
                                                                         CUdeviceptr dptr,
                                                                         size_t size,
                                                                         CUmemRangeHandleType type,
                                                                         unsigned long long flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    if (handle == nullptr || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || size == 0 ||
        dptr % page != 0 || size % page != 0 ||
        (flags & ~0x1ull) != 0) {  // CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (resolve_range_locked(s, dptr, size) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int fd = ::memfd_create("testdriver-dmabuf", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      if (fd >= 0) ::close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *static_cast<int*>(handle) = fd;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxResetPersistingL2Cache() {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    ++s.persisting_l2_resets;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuFlushGPUDirectRDMAWrites(
    CUflushGPUDirectRDMAWritesTarget target, CUflushGPUDirectRDMAWritesScope scope) {
  return entry([&](State&) {
    if (target != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
        (scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER &&
         scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

// 2^30 elements, whatever the format (an H200's answer for 1 float and 4 bytes, measured).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetTexture1DLinearMaxWidth(size_t* width,
                                                                              CUarray_format format,
                                                                              unsigned channels,
                                                                              CUdevice device) {
  return entry([&](State& s) {
    if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size()) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (width == nullptr || channel_bytes(format) == 0 ||
        (channels != 1 && channels != 2 && channels != 4)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *width = std::size_t{1} << 30;
    return CUDA_SUCCESS;
  });
}

namespace {

// Host atomics: none, for every operation (an H200 over PCIe answers 0, measured). Between GPUs
// (not measured: one GPU was lent): integer operations on 32 and 64 bits, signed and unsigned.
unsigned capabilities_of(CUatomicOperation op, bool peer) {
  constexpr unsigned kInteger = CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
                                CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
  if (!peer) return 0;
  return op >= CU_ATOMIC_OPERATION_FLOAT_ADD ? 0 : kInteger;
}

CUresult atomic_capabilities(unsigned* caps, const CUatomicOperation* ops, unsigned count,
                             bool peer) {
  if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    if (ops[i] >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
    caps[i] = capabilities_of(ops[i], peer);
  }
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetHostAtomicCapabilities(
    unsigned int* caps, const CUatomicOperation* ops, unsigned int count, CUdevice device) {
  return entry([&](State& s) {
    if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size()) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    return atomic_capabilities(caps, ops, count, false);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuDeviceGetP2PAtomicCapabilities(unsigned int* caps, const CUatomicOperation* ops,
                                 unsigned int count, CUdevice src, CUdevice dst) {
  return entry([&](State& s) {
    const auto n = static_cast<CUdevice>(s.devices.size());
    if (src < 0 || dst < 0 || src >= n || dst >= n || src == dst) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    return atomic_capabilities(caps, ops, count, true);
  });
}

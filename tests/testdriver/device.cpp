// cuInit, the driver version and the device queries: an H100/H200-like device per ordinal.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/testdriver/query_socket.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr int kDefaultDevices = 1;
constexpr long kDefaultMemoryMb = 16384;
constexpr long kMaxMemoryMb = 1L << 20;  // keeps every device's reservation well inside 47 bits

// An unset, unparsable or non-positive value means the default; `max` clamps.
long env_long(const char* name, long fallback, long max) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end != '\0' || v < 0) return fallback;
  return v > max ? max : v;
}

// Values of an H100/H200 SXM where a program could care; every other attribute in range is 0.
int attribute_value(CUdevice_attribute attrib, int ordinal) {
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return kMaxThreadsPerBlock;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return kSharedPerBlock;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return static_cast<int>(kSmCount);
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      return 6 + ordinal;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return kMaxThreadsPerSm;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 2;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      return 1;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      return kSharedPerSm;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO:
      return 2;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
      return 1;
    // cuMemHostGetDevicePointer returns the host pointer itself, which this promises.
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return kSharedPerBlockOptin;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      return kMaxBlocksPerSm;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT:
      return 4;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID:
      return -1;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID:
      return 0x233510DE;  // H200 SXM
    default:
      return 0;
  }
}

}  // namespace
}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuInit(unsigned int flags) {
  State& s = state();
  if (s.forked.load()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  try {
    std::lock_guard lock(s.mutex);
    if (s.initialized.load()) return CUDA_SUCCESS;
    const long count = env_long("MPSSHIM_TESTDRIVER_DEVICES", kDefaultDevices, kMaxDevices);
    if (count == 0) return CUDA_ERROR_NO_DEVICE;
    long mb = env_long("MPSSHIM_TESTDRIVER_MEMORY_MB", kDefaultMemoryMb, kMaxMemoryMb);
    if (mb == 0) mb = kDefaultMemoryMb;
    for (int d = 0; d < count; ++d) {
      auto dev = std::make_unique<Device>();
      dev->ordinal = d;
      dev->memory.reserve(static_cast<std::size_t>(mb) << 20);
      s.devices.push_back(std::move(dev));
    }
    s.initialized.store(true);
    start_stats_file(s);
    start_query_socket();
    return CUDA_SUCCESS;
  } catch (...) {
    s.devices.clear();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

// Like the real driver, answers before cuInit.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* count) {
  return entry([&](State& s) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = static_cast<int>(s.devices.size());
    return CUDA_SUCCESS;
  });
}

// The test devices are joined like the two H200s measured (NVLink): every pair can reach each
// other, with native atomics, at the best performance rank.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev,
                                                                 CUdevice peer) {
  return entry([&](State& s) {
    if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev) || !valid_device(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value,
                                                                   CUdevice_P2PAttribute attribute,
                                                                   CUdevice src, CUdevice dst) {
  return entry([&](State& s) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, src) || !valid_device(s, dst) || src == dst) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (attribute) {
      case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
        *value = 0;
        return CUDA_SUCCESS;
      case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
        *value = 1;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  return entry([&](State& s) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  return entry([&](State& s) {
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<std::size_t>(len), "mpsshim test device %d", dev);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return entry([&](State& s) {
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    // "mpsshim-testdev" then the ordinal: stable across runs, distinct per device.
    static constexpr char kPrefix[] = "mpsshim-testdev";
    static_assert(sizeof(kPrefix) == sizeof(uuid->bytes));
    std::memcpy(uuid->bytes, kPrefix, sizeof(uuid->bytes));
    uuid->bytes[15] = static_cast<char>(dev);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return entry([&](State& s) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = s.devices[static_cast<std::size_t>(dev)]->memory.size();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib,
                                                                CUdevice dev) {
  return entry([&](State& s) {
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (attrib < CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
      return CUDA_ERROR_INVALID_VALUE;
    *pi = attribute_value(attrib, dev);
    return CUDA_SUCCESS;
  });
}

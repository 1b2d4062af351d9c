// cuInit and device queries, answered from the snapshot the daemon sent at cuInit. The SM count
// a client sees is its quota, as under MPS.
#include <cstdio>
#include <cstring>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/host_memory.hpp"

using namespace mpsshim::shim;

namespace {

const mpsshim::proto::DeviceSnapshot* snapshot_of(CUdevice dev, CUresult& rc) {
  rc = init_status();
  if (rc != CUDA_SUCCESS) return nullptr;
  const auto* snapshot = device_snapshot(dev);
  if (snapshot == nullptr) rc = CUDA_ERROR_INVALID_DEVICE;
  return snapshot;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return initialize();
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = advertised_driver_version();
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = visible_device_count();
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= visible_device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  CUresult rc;
  const auto* snapshot = snapshot_of(dev, rc);
  if (snapshot == nullptr) return rc;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::size_t n = strnlen(snapshot->name, sizeof snapshot->name);
  n = std::min<std::size_t>(n, static_cast<std::size_t>(len - 1));
  std::memcpy(name, snapshot->name, n);
  name[n] = '\0';
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  CUresult rc;
  const auto* snapshot = snapshot_of(dev, rc);
  if (snapshot == nullptr) return rc;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(uuid->bytes, snapshot->uuid, sizeof uuid->bytes);
  return CUDA_SUCCESS;
}

// v1 and v2 give the same bytes: the integrity check hashes them (docs/private-tables.md,
// "Inputs").
MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return cuDeviceGetUuid_v2(uuid, dev);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  CUresult rc;
  const auto* snapshot = snapshot_of(dev, rc);
  if (snapshot == nullptr) return rc;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = snapshot->total_memory;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  size_t total = 0;
  CUresult rc = cuDeviceTotalMem_v2(&total, dev);
  if (rc == CUDA_SUCCESS) *bytes = static_cast<unsigned int>(std::min<size_t>(total, 0xffffffffu));
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attribute,
                                                     CUdevice dev) {
  CUresult rc;
  const auto* snapshot = snapshot_of(dev, rc);
  if (snapshot == nullptr) [[unlikely]]
    return rc;
  if (value == nullptr || attribute <= 0 ||
      static_cast<std::uint32_t>(attribute) >= snapshot->attribute_count) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (attribute == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
    *value = client_sm_count(dev);
    return CUDA_SUCCESS;
  }
  if (masked_under_shim(attribute)) {  // no pageable or device-mapped registered memory
    *value = 0;
    return CUDA_SUCCESS;
  }
  if (attribute == CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES) {
    // Pools are exported as file descriptors only (memory_pool_ipc.cpp): no fabric handles.
    *value = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return CUDA_SUCCESS;
  }
  *value = snapshot->attributes[attribute];
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  CUresult rc;
  const auto* snapshot = snapshot_of(dev, rc);
  if (snapshot == nullptr) return rc;
  if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *major = snapshot->attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
  *minor = snapshot->attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice dev) {
  CUresult rc;
  const auto* snapshot = snapshot_of(dev, rc);
  if (snapshot == nullptr) return rc;
  if (bus_id == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(bus_id, static_cast<size_t>(len), "%08x:%02x:%02x.0",
                snapshot->attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID],
                snapshot->attributes[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID],
                snapshot->attributes[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* bus_id) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (dev == nullptr || bus_id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned domain = 0, bus = 0, device = 0;
  // Accepts [domain]:[bus]:[device].[function] and [bus]:[device].[function], hex.
  if (std::sscanf(bus_id, "%x:%x:%x", &domain, &bus, &device) != 3) {
    domain = 0;
    if (std::sscanf(bus_id, "%x:%x", &bus, &device) != 2) return CUDA_ERROR_INVALID_VALUE;
  }
  for (int i = 0; i < visible_device_count(); ++i) {
    const auto* s = device_snapshot(i);
    if (static_cast<unsigned>(s->attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]) == domain &&
        static_cast<unsigned>(s->attributes[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]) == bus &&
        static_cast<unsigned>(s->attributes[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]) == device) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetProperties(CUdevprop* prop, CUdevice dev) {
  CUresult rc;
  const auto* s = snapshot_of(dev, rc);
  if (s == nullptr) return rc;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  prop->maxThreadsPerBlock = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
  prop->maxThreadsDim[0] = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X];
  prop->maxThreadsDim[1] = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y];
  prop->maxThreadsDim[2] = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z];
  prop->maxGridSize[0] = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X];
  prop->maxGridSize[1] = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y];
  prop->maxGridSize[2] = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z];
  prop->sharedMemPerBlock = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK];
  prop->totalConstantMemory = s->attributes[CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY];
  prop->SIMDWidth = s->attributes[CU_DEVICE_ATTRIBUTE_WARP_SIZE];
  prop->memPitch = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_PITCH];
  prop->regsPerBlock = s->attributes[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK];
  prop->clockRate = s->attributes[CU_DEVICE_ATTRIBUTE_CLOCK_RATE];
  prop->textureAlign = s->attributes[CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT];
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetExecAffinitySupport(int* supported, CUexecAffinityType,
                                                               CUdevice dev) {
  CUresult rc;
  if (snapshot_of(dev, rc) == nullptr) return rc;
  if (supported == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *supported = 0;
  return CUDA_SUCCESS;
}

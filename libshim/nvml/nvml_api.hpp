// The few NVML types and values the share view touches, as NVML's public API defines them (the
// ABI of libnvidia-ml.so.1; no nvml.h is needed to build). Every other entry point is forwarded
// without looking at its arguments (forwarders.py).
#pragma once

#include <cstdint>

namespace mpsshim::nvml {

using Return = int;  // nvmlReturn_t
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorArgumentVersionMismatch = 25;
// gpuInstanceId / computeInstanceId of a process outside MIG.
inline constexpr unsigned kValueNotAvailable = 0xffffffffu;

using Device = struct nvmlDevice_st*;  // nvmlDevice_t

struct Memory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct MemoryV2 {  // nvmlMemory_v2_t
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
// NVML_STRUCT_VERSION(Memory, 2)
inline constexpr unsigned kMemoryV2Version = sizeof(MemoryV2) | (2u << 24);

struct ProcessInfoV1 {  // nvmlProcessInfo_v1_t
  unsigned int pid;
  unsigned long long usedGpuMemory;
};

struct ProcessInfo {  // nvmlProcessInfo_v2_t, nvmlProcessInfo_t (the _v2 and _v3 calls)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};

// nvmlDeviceAttributes_t starts with multiprocessorCount in both of its versions.
struct AttributesHead {
  unsigned int multiprocessorCount;
};

static_assert(sizeof(Memory) == 24 && sizeof(MemoryV2) == 40);
static_assert(sizeof(ProcessInfoV1) == 16 && sizeof(ProcessInfo) == 24);

}  // namespace mpsshim::nvml

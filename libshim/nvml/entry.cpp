// The NVML entry points that answer with this process's share instead of the physical GPU
// (docs/nvml.md). Each calls the real one first, so a device handle, a version or a buffer the
// real library refuses is refused the same way; then it replaces what the share decides. A GPU
// without a share (no daemon, or one this process may not use) keeps the real answer.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "libshim/nvml/export_table.hpp"
#include "libshim/nvml/nvml_api.hpp"
#include "libshim/nvml/real_nvml.hpp"
#include "libshim/nvml/share_view.hpp"

namespace mpsshim::nvml {

namespace {

// What the share says of memory: total, free, used. The scope cannot take more than the GPU
// has free either, so free is the smaller of the two.
struct MemoryFigures {
  unsigned long long total, free, used;
};
MemoryFigures memory_of(const GpuShare& share, unsigned long long physical_total,
                        unsigned long long physical_free) {
  const unsigned long long total = share.memory_limit.value_or(physical_total);
  const unsigned long long room = total > share.memory_used ? total - share.memory_used : 0;
  return MemoryFigures{total, std::min(room, physical_free), share.memory_used};
}

// The share's processes into an NVML process array (the _v1 layout or the later one).
template <typename Info>
Return fill_processes(const GpuShare& share, unsigned* count, Info* infos) {
  const auto needed = static_cast<unsigned>(share.processes.size());
  if (*count < needed) {
    *count = needed;
    return kErrorInsufficientSize;
  }
  if (needed > 0 && infos == nullptr) return kErrorInvalidArgument;
  for (unsigned i = 0; i < needed; ++i) {
    Info info{};
    info.pid = share.processes[i].pid;
    info.usedGpuMemory = share.processes[i].memory_used;
    if constexpr (sizeof(Info) == sizeof(ProcessInfo)) {
      info.gpuInstanceId = kValueNotAvailable;
      info.computeInstanceId = kValueNotAvailable;
    }
    infos[i] = info;
  }
  *count = needed;
  return kSuccess;
}

// A process list call: checked by the real one, answered with the share's processes (compute)
// or none (graphics, MPS: the scope's clients are compute clients of mpsshim's servers).
template <typename Info>
Return processes(const char* name, Device device, unsigned* count, Info* infos, bool compute) {
  using Fn = Return(Device, unsigned*, Info*);
  auto* fn = real<Fn>(name);
  if (fn == nullptr) return kErrorFunctionNotFound;
  auto share = count != nullptr ? share_of_device(device) : std::nullopt;
  if (!share) return fn(device, count, infos);
  // Validate the handle with a size query (a bad handle fails here as it would natively).
  unsigned probe = 0;
  if (Return r = fn(device, &probe, nullptr); r != kSuccess && r != kErrorInsufficientSize) {
    return r;
  }
  if (!compute) {
    *count = 0;
    return kSuccess;
  }
  return fill_processes(*share, count, infos);
}

}  // namespace

}  // namespace mpsshim::nvml

using namespace mpsshim::nvml;

#define MPSSHIM_NVML_EXPORT extern "C" __attribute__((visibility("default")))

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMemoryInfo(Device device, Memory* memory) {
  auto* fn = real<Return(Device, Memory*)>("nvmlDeviceGetMemoryInfo");
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(device, memory);
  if (r != kSuccess) return r;
  if (auto share = share_of_device(device)) {
    MemoryFigures m = memory_of(*share, memory->total, memory->free);
    *memory = Memory{m.total, m.free, m.used};
  }
  return r;
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMemoryInfo_v2(Device device, MemoryV2* memory) {
  auto* fn = real<Return(Device, MemoryV2*)>("nvmlDeviceGetMemoryInfo_v2");
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(device, memory);
  if (r != kSuccess) return r;
  if (auto share = share_of_device(device)) {
    MemoryFigures m = memory_of(*share, memory->total, memory->free);
    // The driver's own reservation is the server's, not the scope's.
    memory->total = m.total;
    memory->reserved = 0;
    memory->free = m.free;
    memory->used = m.used;
  }
  return r;
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetUtilizationRates(Device device, Utilization* rates) {
  auto* fn = real<Return(Device, Utilization*)>("nvmlDeviceGetUtilizationRates");
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(device, rates);
  if (r != kSuccess) return r;
  if (auto share = share_of_device(device); share && share->busy_percent) {
    rates->gpu = static_cast<unsigned>(std::lround(*share->busy_percent));
  }
  return r;
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetAttributes(Device device, AttributesHead* attributes) {
  auto* fn = real<Return(Device, AttributesHead*)>("nvmlDeviceGetAttributes");
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(device, attributes);
  if (r != kSuccess) return r;
  if (auto share = share_of_device(device)) attributes->multiprocessorCount = share->sms;
  return r;
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetAttributes_v2(Device device, AttributesHead* attributes) {
  auto* fn = real<Return(Device, AttributesHead*)>("nvmlDeviceGetAttributes_v2");
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(device, attributes);
  if (r != kSuccess) return r;
  if (auto share = share_of_device(device)) attributes->multiprocessorCount = share->sms;
  return r;
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetComputeRunningProcesses(Device d, unsigned* n,
                                                                ProcessInfoV1* p) {
  return processes("nvmlDeviceGetComputeRunningProcesses", d, n, p, true);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetComputeRunningProcesses_v2(Device d, unsigned* n,
                                                                   ProcessInfo* p) {
  return processes("nvmlDeviceGetComputeRunningProcesses_v2", d, n, p, true);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetComputeRunningProcesses_v3(Device d, unsigned* n,
                                                                   ProcessInfo* p) {
  return processes("nvmlDeviceGetComputeRunningProcesses_v3", d, n, p, true);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetGraphicsRunningProcesses(Device d, unsigned* n,
                                                                 ProcessInfoV1* p) {
  return processes("nvmlDeviceGetGraphicsRunningProcesses", d, n, p, false);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetGraphicsRunningProcesses_v2(Device d, unsigned* n,
                                                                    ProcessInfo* p) {
  return processes("nvmlDeviceGetGraphicsRunningProcesses_v2", d, n, p, false);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetGraphicsRunningProcesses_v3(Device d, unsigned* n,
                                                                    ProcessInfo* p) {
  return processes("nvmlDeviceGetGraphicsRunningProcesses_v3", d, n, p, false);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMPSComputeRunningProcesses(Device d, unsigned* n,
                                                                   ProcessInfoV1* p) {
  return processes("nvmlDeviceGetMPSComputeRunningProcesses", d, n, p, false);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMPSComputeRunningProcesses_v2(Device d, unsigned* n,
                                                                      ProcessInfo* p) {
  return processes("nvmlDeviceGetMPSComputeRunningProcesses_v2", d, n, p, false);
}
MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMPSComputeRunningProcesses_v3(Device d, unsigned* n,
                                                                      ProcessInfo* p) {
  return processes("nvmlDeviceGetMPSComputeRunningProcesses_v3", d, n, p, false);
}

// nvidia-smi's process table (export_table.hpp).
MPSSHIM_NVML_EXPORT Return nvmlInternalGetExportTable(const void** table, const void* uuid) {
  auto* fn = real<Return(const void**, const void*)>("nvmlInternalGetExportTable");
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(table, uuid);
  if (r == kSuccess && table != nullptr) *table = patched_export_table(*table, uuid);
  return r;
}

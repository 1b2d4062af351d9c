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
#include "libshim/nvml/process_list.hpp"
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

// A public process list (the _v1 layout or the later one).
template <typename Info>
Return processes(const char* name, Device device, unsigned* count, Info* infos, bool compute) {
  return answer_process_list(real<Return(Device, unsigned*, Info*)>(name), device, count, infos,
                             compute, [](Info& info, const ShareProcess& process) {
                               info = Info{};
                               info.pid = process.pid;
                               info.usedGpuMemory = process.memory_used;
                               if constexpr (sizeof(Info) == sizeof(ProcessInfo)) {
                                 info.gpuInstanceId = kValueNotAvailable;
                                 info.computeInstanceId = kValueNotAvailable;
                               }
                             });
}

// Calls the real `name` and, when it succeeded on a device with a share, lets `adjust` replace
// what the share decides in its answer.
template <typename Out, typename Adjust>
Return adjusted(const char* name, Device device, Out* out, Adjust adjust) {
  auto* fn = real<Return(Device, Out*)>(name);
  if (fn == nullptr) return kErrorFunctionNotFound;
  Return r = fn(device, out);
  if (r != kSuccess) return r;
  if (auto share = share_of_device(device)) adjust(*share, *out);
  return r;
}

}  // namespace

}  // namespace mpsshim::nvml

using namespace mpsshim::nvml;

#define MPSSHIM_NVML_EXPORT extern "C" __attribute__((visibility("default")))

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMemoryInfo(Device device, Memory* memory) {
  return adjusted("nvmlDeviceGetMemoryInfo", device, memory,
                  [](const GpuShare& share, Memory& out) {
                    MemoryFigures m = memory_of(share, out.total, out.free);
                    out = Memory{m.total, m.free, m.used};
                  });
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetMemoryInfo_v2(Device device, MemoryV2* memory) {
  return adjusted("nvmlDeviceGetMemoryInfo_v2", device, memory,
                  [](const GpuShare& share, MemoryV2& out) {
                    MemoryFigures m = memory_of(share, out.total, out.free);
                    out.total = m.total;
                    out.reserved = 0;  // the driver's own reservation is the server's
                    out.free = m.free;
                    out.used = m.used;
                  });
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetUtilizationRates(Device device, Utilization* rates) {
  return adjusted("nvmlDeviceGetUtilizationRates", device, rates,
                  [](const GpuShare& share, Utilization& out) {
                    if (share.busy_percent) {
                      out.gpu = static_cast<unsigned>(std::lround(*share.busy_percent));
                    }
                  });
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetAttributes(Device device, AttributesHead* attributes) {
  return adjusted(
      "nvmlDeviceGetAttributes", device, attributes,
      [](const GpuShare& share, AttributesHead& out) { out.multiprocessorCount = share.sms; });
}

MPSSHIM_NVML_EXPORT Return nvmlDeviceGetAttributes_v2(Device device, AttributesHead* attributes) {
  return adjusted(
      "nvmlDeviceGetAttributes_v2", device, attributes,
      [](const GpuShare& share, AttributesHead& out) { out.multiprocessorCount = share.sms; });
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

// What a program sees through NVML, as key=value lines: it opens libnvidia-ml.so.1 as pynvml and
// nvidia-smi do (dlopen by SONAME: libmpsshim-nvml.so when preloaded) and asks every device.
//   device=0 uuid=GPU-… name=… total=… free=… used=… v2_total=… v2_reserved=… v2_free=…
//   v2_used=… gpu_util=… memory_util=… sms=… processes=pid:bytes,… power=<NVML return code>
//   table_processes=pid:bytes:name,… (nvidia-smi's private process list)
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "libshim/nvml/export_table.hpp"
#include "libshim/nvml/nvml_api.hpp"

using namespace mpsshim::nvml;

namespace {

void* library = nullptr;

template <typename Fn>
Fn* fn(const char* name) {
  auto* f = reinterpret_cast<Fn*>(dlsym(library, name));
  if (f == nullptr) {
    std::printf("FAIL no %s\n", name);
    std::exit(1);
  }
  return f;
}

#define MUST(call)                                     \
  do {                                                 \
    Return r_ = (call);                                \
    if (r_ != kSuccess) {                              \
      std::printf("FAIL %s returned %d\n", #call, r_); \
      return 1;                                        \
    }                                                  \
  } while (0)

}  // namespace

int main() {
  library = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (library == nullptr) {
    std::printf("FAIL dlopen: %s\n", dlerror());
    return 1;
  }
  MUST(fn<Return()>("nvmlInit_v2")());
  unsigned count = 0;
  MUST(fn<Return(unsigned*)>("nvmlDeviceGetCount_v2")(&count));
  for (unsigned i = 0; i < count; ++i) {
    Device device{};
    MUST(fn<Return(unsigned, Device*)>("nvmlDeviceGetHandleByIndex_v2")(i, &device));
    char uuid[96] = {}, name[96] = {};
    MUST(fn<Return(Device, char*, unsigned)>("nvmlDeviceGetUUID")(device, uuid, sizeof uuid));
    MUST(fn<Return(Device, char*, unsigned)>("nvmlDeviceGetName")(device, name, sizeof name));
    Memory memory{};
    MUST(fn<Return(Device, Memory*)>("nvmlDeviceGetMemoryInfo")(device, &memory));
    MemoryV2 v2{};
    v2.version = kMemoryV2Version;
    MUST(fn<Return(Device, MemoryV2*)>("nvmlDeviceGetMemoryInfo_v2")(device, &v2));
    Utilization rates{};
    MUST(fn<Return(Device, Utilization*)>("nvmlDeviceGetUtilizationRates")(device, &rates));
    AttributesHead attributes{};
    MUST(fn<Return(Device, AttributesHead*)>("nvmlDeviceGetAttributes_v2")(device, &attributes));
    auto* list =
        fn<Return(Device, unsigned*, ProcessInfo*)>("nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned n = 0;
    Return sized = list(device, &n, nullptr);
    if (sized != kSuccess && sized != kErrorInsufficientSize) {
      std::printf("FAIL process count returned %d\n", sized);
      return 1;
    }
    ProcessInfo infos[64] = {};
    n = 64;
    MUST(list(device, &n, infos));
    std::string processes;
    for (unsigned k = 0; k < n; ++k) {
      processes += (k ? "," : "") + std::to_string(infos[k].pid) + ":" +
                   std::to_string(infos[k].usedGpuMemory);
    }
    const void* table = nullptr;
    MUST(fn<Return(const void**, const void*)>("nvmlInternalGetExportTable")(&table,
                                                                             kProcessTableUuid));
    std::uint64_t word = 0;
    std::memcpy(&word, static_cast<const char*>(table) + 8 * kComputeProcessesWord, sizeof word);
    auto* table_list = reinterpret_cast<Return (*)(Device, unsigned*, InternalProcess*)>(word);
    static InternalProcess entries[8];
    unsigned listed = 8;
    MUST(table_list(device, &listed, entries));
    std::string table_processes;
    for (unsigned k = 0; k < listed; ++k) {
      table_processes += (k ? "," : "") + std::to_string(entries[k].pid) + ":" +
                         std::to_string(entries[k].usedGpuMemory) + ":" + entries[k].name;
    }
    unsigned milliwatts = 0;
    Return power = fn<Return(Device, unsigned*)>("nvmlDeviceGetPowerUsage")(device, &milliwatts);
    std::printf(
        "device=%u uuid=%s name=%s total=%llu free=%llu used=%llu v2_total=%llu v2_reserved=%llu "
        "v2_free=%llu v2_used=%llu gpu_util=%u memory_util=%u sms=%u processes=%s power=%d "
        "table_processes=%s\n",
        i, uuid, name, memory.total, memory.free, memory.used, v2.total, v2.reserved, v2.free,
        v2.used, rates.gpu, rates.memory, attributes.multiprocessorCount,
        processes.empty() ? "-" : processes.c_str(), power,
        table_processes.empty() ? "-" : table_processes.c_str());
  }
  fn<Return()>("nvmlShutdown")();
  std::printf("PASS\n");
  return 0;
}

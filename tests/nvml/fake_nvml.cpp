// A stand-in for the real libnvidia-ml.so.1 (ELF SONAME the same) behind libmpsshim-nvml.so in
// the CPU tests: the physical view of GPUs whose UUIDs FAKE_NVML_UUIDS lists (comma-separated;
// the test driver's), each 80 GiB with 70 GiB free, 77% busy, 132 SMs and one process (pid 1,
// the server). Only the entry points the share view reads, and a few it forwards untouched, are
// here, with the private process table nvidia-smi reads (export_table.hpp); the rest are
// missing, as in an older driver.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libshim/nvml/export_table.hpp"
#include "libshim/nvml/nvml_api.hpp"

using namespace mpsshim::nvml;

namespace {

constexpr unsigned long long kGiB = 1ull << 30;

struct FakeDevice {
  std::string uuid;
};

std::vector<FakeDevice>& devices() {
  static std::vector<FakeDevice> list = [] {
    std::vector<FakeDevice> out;
    const char* text = std::getenv("FAKE_NVML_UUIDS");
    std::string rest = text != nullptr ? text : "";
    while (!rest.empty()) {
      auto comma = rest.find(',');
      out.push_back(FakeDevice{rest.substr(0, comma)});
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    }
    return out;
  }();
  return list;
}

FakeDevice* from(Device device) {
  for (FakeDevice& d : devices()) {
    if (reinterpret_cast<Device>(&d) == device) return &d;
  }
  return nullptr;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT Return nvmlInit_v2() {
  return kSuccess;
}
FAKE_EXPORT Return nvmlShutdown() {
  return kSuccess;
}
FAKE_EXPORT const char* nvmlErrorString(Return r) {
  return r == kSuccess ? "Success" : "fake NVML error";
}
FAKE_EXPORT Return nvmlDeviceGetCount_v2(unsigned* count) {
  *count = static_cast<unsigned>(devices().size());
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetHandleByIndex_v2(unsigned index, Device* device) {
  if (index >= devices().size()) return kErrorInvalidArgument;
  *device = reinterpret_cast<Device>(&devices()[index]);
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetUUID(Device device, char* uuid, unsigned length) {
  FakeDevice* d = from(device);
  if (d == nullptr || uuid == nullptr) return kErrorInvalidArgument;
  if (length < d->uuid.size() + 1) return kErrorInsufficientSize;
  std::memcpy(uuid, d->uuid.c_str(), d->uuid.size() + 1);
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetName(Device device, char* name, unsigned length) {
  if (from(device) == nullptr || length < 16) return kErrorInvalidArgument;
  std::strcpy(name, "FakeGPU-80GB");
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetMemoryInfo(Device device, Memory* memory) {
  if (from(device) == nullptr || memory == nullptr) return kErrorInvalidArgument;
  *memory = Memory{80 * kGiB, 70 * kGiB, 10 * kGiB};
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetMemoryInfo_v2(Device device, MemoryV2* memory) {
  if (from(device) == nullptr || memory == nullptr) return kErrorInvalidArgument;
  if (memory->version != kMemoryV2Version) return kErrorArgumentVersionMismatch;
  memory->total = 80 * kGiB;
  memory->reserved = kGiB / 2;
  memory->free = 70 * kGiB;
  memory->used = 10 * kGiB - kGiB / 2;
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetUtilizationRates(Device device, Utilization* rates) {
  if (from(device) == nullptr || rates == nullptr) return kErrorInvalidArgument;
  *rates = Utilization{77, 33};
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetAttributes_v2(Device device, AttributesHead* attributes) {
  if (from(device) == nullptr || attributes == nullptr) return kErrorInvalidArgument;
  attributes->multiprocessorCount = 132;
  return kSuccess;
}
FAKE_EXPORT Return nvmlDeviceGetComputeRunningProcesses_v3(Device device, unsigned* count,
                                                           ProcessInfo* infos) {
  if (from(device) == nullptr || count == nullptr) return kErrorInvalidArgument;
  if (*count < 1) {
    *count = 1;
    return kErrorInsufficientSize;
  }
  infos[0] = ProcessInfo{1, 10 * kGiB, kValueNotAvailable, kValueNotAvailable};
  *count = 1;
  return kSuccess;
}

namespace {

// The private table's process lists: the server on every device (compute), nothing else.
Return table_processes(Device device, unsigned* count, InternalProcess* entries, bool any) {
  if (from(device) == nullptr || count == nullptr) return kErrorInvalidArgument;
  const unsigned needed = any ? 1 : 0;
  if (*count < needed) {
    *count = needed;
    return kErrorInsufficientSize;
  }
  if (needed == 1) {
    std::memset(&entries[0], 0, sizeof entries[0]);
    entries[0].pid = 1;
    entries[0].usedGpuMemory = 10 * kGiB;
    std::strcpy(entries[0].name, "mpsshim-server");
  }
  *count = needed;
  return kSuccess;
}
Return compute_table(Device d, unsigned* n, InternalProcess* e) {
  return table_processes(d, n, e, true);
}
Return other_table(Device d, unsigned* n, InternalProcess* e) {
  return table_processes(d, n, e, false);
}

}  // namespace

FAKE_EXPORT Return nvmlInternalGetExportTable(const void** table, const void* uuid) {
  static std::uint64_t words[kProcessTableBytes / 8] = {kProcessTableBytes};
  if (table == nullptr || uuid == nullptr) return kErrorInvalidArgument;
  if (std::memcmp(uuid, kProcessTableUuid, sizeof kProcessTableUuid) != 0) return kErrorNotFound;
  words[kComputeProcessesWord] = reinterpret_cast<std::uint64_t>(&compute_table);
  words[kGraphicsProcessesWord] = reinterpret_cast<std::uint64_t>(&other_table);
  words[kMpsProcessesWord] = reinterpret_cast<std::uint64_t>(&other_table);
  *table = words;
  return kSuccess;
}

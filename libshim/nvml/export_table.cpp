#include "libshim/nvml/export_table.hpp"

#include <atomic>
#include <cstring>
#include <mutex>

#include "common/log.hpp"
#include "libshim/nvml/process_list.hpp"

namespace mpsshim::nvml {

namespace {

using List = Return(Device, unsigned*, InternalProcess*);

struct Patched {
  std::once_flag once;
  const void* real_table = nullptr;  // what the copy was made of
  std::uint64_t words[kProcessTableBytes / 8] = {};
  List* compute = nullptr;
  List* graphics = nullptr;
  List* mps = nullptr;
};

Patched& patched() {
  static Patched* p = new Patched();  // never destroyed: nvidia-smi may call it at exit
  return *p;
}

// The share's processes into the table's entries (process_list.hpp's rule).
Return list(List* real_list, Device device, unsigned* count, InternalProcess* entries,
            bool compute) {
  return answer_process_list(real_list, device, count, entries, compute,
                             [](InternalProcess& entry, const ShareProcess& process) {
                               std::memset(&entry, 0, sizeof entry);
                               entry.pid = process.pid;
                               entry.usedGpuMemory = process.memory_used;
                               entry.gpuInstanceId = kValueNotAvailable;
                               entry.computeInstanceId = kValueNotAvailable;
                               std::strncpy(entry.name, process.program.c_str(),
                                            sizeof entry.name - 1);
                             });
}

Return compute_list(Device d, unsigned* n, InternalProcess* e) {
  return list(patched().compute, d, n, e, true);
}
Return graphics_list(Device d, unsigned* n, InternalProcess* e) {
  return list(patched().graphics, d, n, e, false);
}
Return mps_list(Device d, unsigned* n, InternalProcess* e) {
  return list(patched().mps, d, n, e, false);
}

}  // namespace

const void* patched_export_table(const void* table, const void* uuid) {
  if (table == nullptr || uuid == nullptr ||
      std::memcmp(uuid, kProcessTableUuid, sizeof kProcessTableUuid) != 0) {
    return table;
  }
  std::uint64_t size = 0;
  std::memcpy(&size, table, sizeof size);
  if (size != kProcessTableBytes) {
    static std::atomic<bool> logged{false};
    log_once(logged, LogLevel::kInfo,
             "libmpsshim-nvml: NVML's process table is {} bytes, not the {} whose layout is "
             "known; nvidia-smi's process list stays the physical GPU's",
             size, kProcessTableBytes);
    return table;
  }
  Patched& p = patched();
  std::call_once(p.once, [&p, table] {
    p.real_table = table;
    std::memcpy(p.words, table, sizeof p.words);
    p.compute = reinterpret_cast<List*>(p.words[kComputeProcessesWord]);
    p.graphics = reinterpret_cast<List*>(p.words[kGraphicsProcessesWord]);
    p.mps = reinterpret_cast<List*>(p.words[kMpsProcessesWord]);
    if (p.compute != nullptr)
      p.words[kComputeProcessesWord] = reinterpret_cast<std::uint64_t>(&compute_list);
    if (p.graphics != nullptr)
      p.words[kGraphicsProcessesWord] = reinterpret_cast<std::uint64_t>(&graphics_list);
    if (p.mps != nullptr) p.words[kMpsProcessesWord] = reinterpret_cast<std::uint64_t>(&mps_list);
  });
  // The real library hands out one table; another one (never seen) is handed out unchanged.
  return p.real_table == table ? static_cast<const void*>(p.words) : table;
}

}  // namespace mpsshim::nvml

// nvidia-smi does not list a GPU's processes with the public calls: it asks NVML's private
// export table (nvmlInternalGetExportTable), whose entries list them into entries of their own.
// On the table whose layout is known (driver 580's: the UUID and size below, measured on an
// H200), this library hands out a copy whose three process-list entries answer with the share's
// processes (entry.cpp's rule); any other table, or another size, is handed out unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libshim/nvml/nvml_api.hpp"

namespace mpsshim::nvml {

// The table's identity as nvmlInternalGetExportTable's second argument gives it.
inline constexpr std::uint8_t kProcessTableUuid[16] = {
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
// Its first word: its size in bytes (270 words).
inline constexpr std::uint64_t kProcessTableBytes = 0x870;
// The words holding (device, unsigned* count, InternalProcess* entries) process lists.
inline constexpr std::size_t kComputeProcessesWord = 213;
inline constexpr std::size_t kGraphicsProcessesWord = 214;
inline constexpr std::size_t kMpsProcessesWord = 215;

// One listed process, as those entries write it: the public nvmlProcessInfo_t, a word nvidia-smi
// leaves 0, and the process's name.
struct InternalProcess {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
  unsigned long long reserved;
  char name[4096];
};
static_assert(sizeof(InternalProcess) == 4128);
static_assert(offsetof(InternalProcess, name) == 32);

// The copy to hand out for `table` (the real one when its layout is not the known one).
const void* patched_export_table(const void* table, const void* uuid);

}  // namespace mpsshim::nvml

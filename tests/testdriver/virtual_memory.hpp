// The test driver's virtual memory management (virtual_memory.cpp), modelled on the GPU's: a
// reservation is a range of device addresses that faults on the host (PROT_NONE, never made
// accessible) plus a shadow range of the same size where the bytes are reached; a physical
// allocation is a memfd; mapping it puts the memfd into the shadow at the same offset, so
// consecutive mappings are one contiguous host view, as they are one contiguous device range.
// Guarded by State::mutex; unmapping also holds State::memory_use exclusively.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

namespace mpsshim::testdriver {

inline constexpr std::size_t kVmmGranularity = std::size_t{2} << 20;  // as on an H100
inline constexpr int kVmmMaxDevices = 8;

struct PhysicalAllocation {
  int device = 0;
  std::size_t size = 0;
  int memfd = -1;
  CUmemAllocationProp prop{};
  std::size_t refs = 1;      // cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease
  std::size_t mappings = 0;  // live mappings; the memory goes when both counts are 0
  // Imported from another process's shareable handle: its bytes are charged to the exporter's
  // device, not to this process's.
  bool imported = false;
};

struct VaReservation {
  std::size_t size = 0;
  std::byte* device_range = nullptr;  // the PROT_NONE addresses handed out
  std::byte* shadow = nullptr;        // where mapped bytes are reached
};

struct VaMapping {
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::uintptr_t reservation = 0;                           // its base
  std::array<unsigned long long, kVmmMaxDevices> access{};  // CUmemAccess_flags per device
};

struct State;

struct VirtualMemory {
  std::map<CUmemGenericAllocationHandle, PhysicalAllocation> physical;
  std::map<std::uintptr_t, VaReservation> reservations;  // by base
  std::map<std::uintptr_t, VaMapping> mappings;          // by base
  CUmemGenericAllocationHandle next_handle = 0x1000;
  std::array<std::size_t, kVmmMaxDevices> physical_bytes{};  // per device, counts as used memory
};

// Closes a physical allocation whose handles were all released and whose last mapping (of an
// address range or a sparse array's tile) went (virtual_memory.cpp; locked).
void destroy_physical(State& s, CUmemGenericAllocationHandle handle);

}  // namespace mpsshim::testdriver

// Host-memory decisions of the shim (docs/host-memory.md): pinned and managed memory are memfds
// this process and the server map at one address (device-mapped there); memory registered with
// cuMemHostRegister is recorded but not mapped for the device (copies from and to it are staged
// like pageable copies), so the device attributes that advertise device access to pageable or
// registered memory read 0.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace mpsshim::shim {

struct PinnedRange;

// Pinned host memory shared with the current context's server (memory.cpp): cuMemHostAlloc's
// flags; `managed` marks cuMemAllocManaged memory, which differs only in how it is answered.
CUresult allocate_pinned(void** pp, size_t bytes, unsigned int flags, bool managed = false);
// Unregisters and unmaps it (the caller has checked that the program may free it).
CUresult free_pinned(const PinnedRange& range);

// A range registered with cuMemHostRegister (host_register.cpp).
struct RegisteredRange {
  std::uintptr_t base;
  std::uint64_t bytes;
  unsigned flags;  // CU_MEMHOSTREGISTER_* as the caller passed them
  int device;      // ordinal of the context current at registration
};

// The registered range holding `address`, if any.
bool find_registered(const void* address, RegisteredRange* out) noexcept;

// cuMemHostGetDevicePointer on registered memory: refused, with the reason logged once.
CUresult registered_device_pointer_refused() noexcept;

// Attributes that advertise pageable-memory access, host access to device-resident managed
// memory or device access to registered memory through the host pointer: none of them holds for
// a client of the server. Managed memory itself is offered (host memory the device maps, so the
// CPU and the GPU may touch it concurrently): MANAGED_MEMORY and CONCURRENT_MANAGED_ACCESS read
// what the device says.
constexpr bool masked_under_shim(CUdevice_attribute attribute) noexcept {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
      return true;
    default:
      return false;
  }
}

}  // namespace mpsshim::shim

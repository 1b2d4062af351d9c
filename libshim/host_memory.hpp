// Host-memory decisions of the shim (docs/host-memory.md): memory registered with
// cuMemHostRegister is recorded but not mapped for the device (copies from and to it are staged
// like pageable copies), and managed memory is not offered, so the device attributes that
// advertise it read 0.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mpsshim::shim {

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

// Attributes that advertise managed memory, pageable-memory access or device access to
// registered memory through the host pointer: none of them holds for a client of the server.
constexpr bool masked_under_shim(CUdevice_attribute attribute) noexcept {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
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

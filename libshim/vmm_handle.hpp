// What a CUmemGenericAllocationHandle the application sees holds: the server's id of the
// allocation in this client's session, with the device ordinal (+1) in bits 24..31 (a server
// id's index half never reaches there: handle_table.hpp bounds it at 2^22 entries). Made by
// cuMemCreate and the imports (vmm.cpp, vmm_share.cpp), read by every call that takes one
// (vmm.cpp, sparse_array.cpp).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "libshim/client.hpp"
#include "libshim/client_view.hpp"

namespace mpsshim::shim {

inline constexpr int kVmmHandleDeviceShift = 24;
inline constexpr std::uint64_t kVmmHandleDeviceMask = std::uint64_t{0xff} << kVmmHandleDeviceShift;
static_assert(kMaxDevices < 0xff);

inline CUmemGenericAllocationHandle to_client(int device, proto::WireHandle wire) {
  return wire | (std::uint64_t(device + 1) << kVmmHandleDeviceShift);
}

// The device ordinal a handle names (-1: none).
inline int vmm_handle_device(CUmemGenericAllocationHandle handle) {
  return static_cast<int>((handle & kVmmHandleDeviceMask) >> kVmmHandleDeviceShift) - 1;
}

// The session and wire id a handle names, or INVALID_VALUE for one this process never had.
inline CUresult from_client(CUmemGenericAllocationHandle handle, Session*& session,
                            proto::WireHandle& wire) {
  const int device = vmm_handle_device(handle);
  if (device < 0 || device >= visible_device_count()) return CUDA_ERROR_INVALID_VALUE;
  wire = handle & ~kVmmHandleDeviceMask;
  return session_for(device, session) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace mpsshim::shim

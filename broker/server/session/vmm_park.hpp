// A suspended client's own physical allocations (cuMemCreate: the driver's VMM calls, PyTorch's
// expandable segments) parked on the host like its cuMemAlloc memory (DeviceHeap::park), so
// that such a client can be suspended too (session/suspension.hpp).
//
// A physical allocation is the unit: its bytes are copied out whole through a mapping of the
// whole of it that the server makes for the copy in its arena (the client may map only part of
// it, map it twice, or hold it unmapped with bytes it wrote earlier), into one block of host
// memory for all of them (VirtualMemory::parked): PyTorch's expandable segments are thousands of
// 2 or 20 MiB allocations, and pinning each on its own would cost far more than the copy. Then
// the client's mappings of it are unmapped and it is released. Its handle, its properties and the
// client's mappings (addresses, offsets, access) stay in the session's books. Resumed, a new
// allocation with the same properties gets the bytes back and is mapped at every one of the
// client's old ranges, with the access it had there, so the client's pointers and handles still
// hold.
//
// Both run in two steps so that a suspend or resume of the client's cuMemAlloc memory and of
// these is all or nothing together: suspend copies out (nothing on the device changes yet), then
// the heap parks, then the allocations are released (or, when the heap failed, the copies are
// dropped); resume restores these first, then the heap, and takes them back off the device when
// the heap fails. Only the session's worker calls these, its streams idle.
//
// Not parked, and staying mapped: allocations the client imported from another process (they are
// that process's memory).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include <tl/expected.hpp>

namespace mpsshim::server {

class Session;

// Why the client's own physical allocations cannot be parked, or empty: one was handed out to
// another process (an fd export, or a handle shared with other clients), or tiles of a sparse
// array are mapped onto it (the server does not follow tiles, so it could not map them again).
std::string why_vmm_not_parkable(Session& session);

struct VmmParked {
  std::uint64_t bytes = 0;
  std::uint64_t pooled = 0;  // of them in the park pool
};

// Step 1 of a suspend: every own physical allocation's bytes copied to host memory, waited for.
// Nothing on the device changes. On an error, no copy is kept.
tl::expected<VmmParked, CUresult> copy_out_vmm(Session& session, CUstream stream);
// Step 2, the suspend going ahead: the client's mappings of them unmapped and the allocations
// released; what was copied out is what is left of them. The bytes released: an allocation
// whose mapping the driver would not unmap stays on the device, logged.
std::uint64_t release_copied_vmm(Session& session);
// Or the suspend not going ahead: the copies given back, the allocations untouched.
void drop_vmm_copies(Session& session);

// Resume: a new allocation for each parked one, its bytes copied back, mapped at each of the
// client's ranges with their access. All or nothing: on an error (CUDA_ERROR_OUT_OF_MEMORY when
// the GPU has no room) nothing is on the device and the host copies stay. The bytes put back.
tl::expected<std::uint64_t, CUresult> restore_vmm(Session& session, CUstream stream);
// After restore_vmm, the resume not going ahead: off the device again; the host copies stay.
void unrestore_vmm(Session& session);
// After restore_vmm, the resume done: the host copies given back (on the heap's thread, in
// `context`).
void free_vmm_copies(Session& session, CUcontext context);

}  // namespace mpsshim::server

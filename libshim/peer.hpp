// Peer access between this process's GPUs (docs/architecture.md, "Peer access"). Each GPU has its
// own server, so memory of GPU g is reachable from GPU h's work only once GPU h's server has
// mapped it: the shim asks g's server for the physical block that holds it (a POSIX fd) and hands
// it to h's server, which maps it at the same address (one device address space). What each
// server has mapped is remembered here, and let go before the memory is freed.
//
// Thread safety: one mutex over the mappings; a mapping's setup (two round trips) holds it, which
// only the first copy or allocation that needs that block pays.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace mpsshim::shim {

// The visible device whose server handed out `address` (from its arena), or -1: host memory, or
// a server without an arena.
int device_of_address(CUdeviceptr address) noexcept;

// Makes [address, address + bytes) reachable from `device`'s work: nothing to do for its own or
// host memory; another GPU's allocation is mapped into `device`'s server first (once).
// CUDA_ERROR_INVALID_VALUE when the memory is not the process's own cuMemAlloc memory.
CUresult reach_from(int device, CUdeviceptr address, std::size_t bytes) noexcept;

// Before the allocation [base, base + bytes) of `owner` is freed: every other server that
// mapped a block of it lets go (its work queued so far may still read it).
void forget_peer_blocks(int owner, CUdeviceptr base, std::size_t bytes) noexcept;

// cuCtxEnablePeerAccess / cuCtxDisablePeerAccess between the devices of two contexts: from then
// on every allocation of `peer` is mapped into `device`'s server when it is made, as the driver
// makes a peer context's memory reachable; the allocations held now are mapped at once.
CUresult enable_peer_access(int device, int peer) noexcept;
CUresult disable_peer_access(int device, int peer) noexcept;
// cuMemSetAccess of a peer GPU on a VMM mapping of `owner` (JAX's allocator, NCCL in one process
// ask so): the physical allocation `handle` (the owner session's wire id) is exported as an fd
// and mapped whole at [base, base + bytes) into `peer`'s server. The mapping must start at the
// allocation's offset 0 and cover it (CUDA_ERROR_NOT_SUPPORTED otherwise, said in the log).
CUresult map_vmm_on_peer(int peer, int owner, CUdeviceptr base, std::size_t bytes,
                         std::uint64_t handle) noexcept;
// Whether `device`'s server maps the block of another GPU holding `address`.
bool peer_maps(int device, CUdeviceptr address) noexcept;

// A new allocation of `owner`: mapped into the servers that enabled peer access to it.
CUresult share_with_peers(int owner, CUdeviceptr base, std::size_t bytes) noexcept;

}  // namespace mpsshim::shim

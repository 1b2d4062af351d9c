// A client's virtual address space on the server (ops/vmm.cpp): the ranges it reserved with
// cuMemAddressReserve and the mappings of its physical allocations (PhysicalAllocObj) into
// them. Owned by the session's worker, like everything in a session. A mapping enters the
// session's AllocationMap (RangeKind::kMapped) only while it is read-write accessible, so copies,
// memsets and pointer checks reach exactly what the GPU would let the client write.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "proto/ops_vmm.hpp"

namespace mpsshim::server {

class Session;
struct FreedTally;
struct IpcMemory;

struct VmmReservation {
  std::uint64_t bytes = 0;
};

struct VmmMapping {
  std::uint64_t bytes = 0;
  std::uint64_t allocation = 0;  // the PhysicalAllocObj's id
  std::uint64_t offset = 0;      // into the allocation
  std::uint32_t access = 0;      // CUmemAccess_flags for the server's device
};

// Another GPU's memory block of this client, mapped into this server at the address its own
// server gave it (ops/peer.cpp): a kernel or copy of this GPU reaches it over the peer link.
struct PeerBlock {
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
};

// A suspended client's physical allocations' bytes on the host: one block for all of them
// (session/vmm_park.hpp), so that it is pinned in pieces as large as a cuMemAlloc block's.
struct ParkedVmm {
  void* host = nullptr;
  std::uint64_t bytes = 0;
  // Between the copy and the release of a suspend for memory preemption: the views of its
  // allocations that the copy made in the addresses the handover prepared
  // (DeviceHeap::place_handover_view), by allocation id, still mapped: each becomes part of the
  // waiting allocation as it is (DeviceHeap::keep_for_handover).
  std::map<std::uint64_t, CUdeviceptr> handover_views;
};

struct VirtualMemory {
  ParkedVmm parked;
  std::map<std::uint64_t, VmmReservation> reservations;  // by base address
  std::map<std::uint64_t, VmmMapping> mappings;          // by base address
  std::map<std::uint64_t, PeerBlock> peer_blocks;        // by base address
  // Other clients' physical allocations this client opened by their shared handle (kVmmOpen,
  // ops/vmm_share.cpp), by the open's id: each keeps its exporter charged until closed.
  std::map<std::uint64_t, std::shared_ptr<IpcMemory>> shared_opens;
  std::uint64_t last_shared_open = 0;
};

// The properties the driver gets for a physical allocation: the client's, on the server's own
// device; CUDA_ERROR_NOT_SUPPORTED (logged) for what mpsshim does not serve (docs/vmm.md).
CUresult driver_prop(const Session& session, const proto::VmmProp& wire, CUmemAllocationProp* out);

// What one client may hold at once, so a client cannot make the server remember without bound.
inline constexpr std::size_t kMaxVmmRanges = std::size_t{1} << 20;

// Unmaps a peer block and lets go of its handle (its streams idle).
void unmap_peer_block(Session& session, const PeerBlock& block);

// Gives a reservation's addresses back: to the server's arena, or to the driver without one.
void free_reservation(Session& session, std::uint64_t base, std::uint64_t bytes);

// Session end, with the client's streams idle: unmaps every mapping, releases every physical
// allocation, frees every reservation, in that order (the driver's own order of teardown), and
// closes the shared allocations it opened.
void free_virtual_memory(Session& session, FreedTally& tally);

// The client's physical allocation `handle` (a live client handle), if it was created asking
// for the POSIX fd handle type, as the driver requires of an export; else nullptr.
struct PhysicalAllocObj;
PhysicalAllocObj* exportable_allocation(Session& session, std::uint64_t handle);

// Gives the client's physical allocation `id` back to the driver once the client holds no
// handle to it and nothing maps it: no address range, no tile of a sparse array (ops/vmm.cpp).
void release_if_unused(Session& session, std::uint64_t id);

// Ends the hold a sparse array's tiles have on each tile pool in `pools` (ids of physical
// allocations it was mapped onto; ops/sparse_array.cpp), as it goes.
void drop_tile_pools(Session& session, const std::vector<std::uint64_t>& pools);

// One open of a shared physical allocation ends (kVmmClose, or the opener's end): the last one
// after its exporter let go gives the exporter its bytes back (ops/vmm_share.cpp).
void close_shared_open(Session& session, const std::shared_ptr<IpcMemory>& memory);

// The exporter lets go of a physical allocation it shared: no later open finds it. True if
// others still hold it open: it stays charged to the exporter until the last of them closes it.
bool unshare_physical(Session& session, const std::shared_ptr<IpcMemory>& memory);

}  // namespace mpsshim::server

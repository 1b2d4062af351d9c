// cuMemAlloc's memory, placed in the server's arena (address_arena.hpp) with the driver's
// virtual memory calls, so that no other GPU's server hands out the same addresses
// (proto/address_arenas.hpp says why the driver's own placement cannot be used).
//
// An allocation of more than kSmallMax bytes is one physical allocation of its own (cuMemCreate,
// rounded up to the granularity, as the driver rounds cuMemAlloc) mapped at a range of the arena.
// Smaller ones share chunks of one granule, and a chunk only ever holds allocations of one owner
// (a session), so that a client's memory is a set of whole physical allocations that can later be
// copied out or mapped elsewhere at the same addresses. Each owner keeps at most one empty chunk,
// so a loop of small cuMemAlloc/cuMemFree makes no driver call after the first.
//
// Measured on an H200 (driver 580, one run): cuMemCreate + cuMemMap + cuMemSetAccess + cuMemUnmap
// + cuMemRelease of 2 MiB 135 us against 123 us for cuMemAlloc + cuMemFree; of 64 MiB 267 us
// against 406 us; of 1 GiB 2.07 ms against 2.16 ms.
//
// Physical allocations ask for the POSIX fd handle type, so another GPU's server can later map
// them at the same address.
//
// A suspended client's memory is parked (park/unpark): each of its blocks is copied to pinned host
// memory and its physical allocation released, while its addresses stay taken in the arena, so
// that unpark puts the bytes back at the same device addresses (session/suspension.hpp).
//
// Memory preemption hands the physical memory it parks to the allocation it makes room for
// instead (start_handover): the driver's cuMemCreate of memory released just before is slow.
// Measured on an H200 (driver 580): cuMemCreate of 116 GiB took 0.8 ms on a fresh GPU, 325-338 ms
// right after the same 116 GiB were released, 168-173 ms after 60 GiB were created and released;
// the driver clears the memory first, at about 0.4 TB/s. The heap clears it with a memset: its
// own blocks on the suspend's copy stream behind the copy, a client's own cuMemCreate memory
// (keep_for_handover) once the allocation has mapped it. A block of such memory is several
// physical allocations mapped one after another (Block::pieces). The allocation's addresses are
// taken when the handover starts, and the suspends map the client's own physical allocations
// there for their copies, so that those are already in place when it is made (handover_range.hpp).
//
// Thread safety: every public function may be called from any worker; one mutex guards the
// bookkeeping and is never held across a driver call. park and unpark of an owner run on the
// worker of that owner's session, the only thread that allocates or frees for it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "broker/server/driver/address_arena.hpp"
#include "broker/server/driver/driver_table.hpp"
#include "broker/server/driver/handover_range.hpp"
#include "broker/server/driver/park_pool.hpp"
#include "broker/server/driver/parked_memory.hpp"

namespace mpsshim::server {

class DeviceHeap {
 public:
  // Allocations up to this size share their owner's chunks.
  static constexpr std::uint64_t kSmallMax = std::uint64_t{1} << 20;
  // cuMemAlloc's guarantee is 256; the driver hands out 512-aligned small allocations.
  static constexpr std::uint64_t kSmallAlignment = 512;

  // Reserves the whole window of arenas from the driver at its fixed address, GPU
  // `arena_index`'s own to allocate from and the others' to map peers' memory into. Null, with
  // the reason in `why`, when the driver cannot (no VMM support, the arena out of range, or the
  // driver placed the reservation elsewhere): the server then lets the driver place cuMemAlloc.
  static std::unique_ptr<DeviceHeap> open(const DriverTable& cu, CUdevice device,
                                          unsigned arena_index, std::string* why);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  AddressArena& arena() { return arena_; }
  std::uint64_t granularity() const { return granularity_; }

  // `bytes` of device memory for `owner`, aligned to at least `alignment` (a power of two): the
  // driver's error when it has no memory (CUDA_ERROR_OUT_OF_MEMORY), or when the arena is full.
  tl::expected<CUdeviceptr, CUresult> allocate(std::uint64_t owner, std::uint64_t bytes,
                                               std::uint64_t alignment = kSmallAlignment);
  // Whether `base` is an allocation of this heap.
  bool owns(CUdeviceptr base) const;
  // Frees an allocation of this heap (any owner's); CUDA_ERROR_INVALID_VALUE if it is none.
  CUresult free(CUdeviceptr base);
  // The physical allocation holding `address` (in an allocation of `owner`), exported as a POSIX
  // fd that another process can map (the caller closes it): the whole block, or the piece of it
  // that holds `address` when the block is made of several (the importer maps each it reaches).
  struct Exported {
    CUdeviceptr base = 0;
    std::uint64_t bytes = 0;
    int fd = -1;
  };
  tl::expected<Exported, CUresult> export_block(std::uint64_t owner, CUdeviceptr address);
  // Gives back the owner's spare chunk; called when its session ends, after its allocations.
  void forget_owner(std::uint64_t owner);

  // Whether a block of `owner` was exported to another process (export_block) or holds memory
  // shared through an IPC handle (mark_exported): others may use it, so it cannot be parked.
  // The mark lasts as long as the block.
  bool exported(std::uint64_t owner) const;
  void mark_exported(CUdeviceptr address);
  // Parks every block of `owner` (its streams idle): copied to pinned host memory on `stream`,
  // then its physical allocation released; its addresses stay taken. Its spare chunk goes back
  // to the driver. All or nothing: when host memory runs out, nothing is parked and the
  // driver's error comes back. The bytes parked, and how many of them in the park pool.
  struct Parked {
    std::uint64_t bytes = 0;
    std::uint64_t pooled = 0;
  };
  // During a handover (start_handover) the blocks are also cleared on `stream` after their copy,
  // and their physical allocations kept for the handover instead of released.
  tl::expected<Parked, CUresult> park(std::uint64_t owner, CUstream stream);
  // Puts every parked block of `owner` back at its address, its bytes copied in on `stream`.
  // All or nothing: when the device has no room, nothing moves and the driver's error
  // (CUDA_ERROR_OUT_OF_MEMORY) comes back. The bytes put back. The host memory is given back
  // afterwards on a thread of the heap's, in `context` (the caller's current one).
  tl::expected<std::uint64_t, CUresult> unpark(std::uint64_t owner, CUstream stream,
                                               CUcontext context);

  // Host memory kept for parking (park_pool.hpp): blocks are parked in it when it has room.
  // Set before any session; null: none.
  void set_park_pool(ParkPool* pool) { pool_ = pool; }

  // Parking memory that is not a block of this heap (a client's own cuMemCreate allocations,
  // session/vmm_park.hpp), with the same host memory as park and unpark.
  // `bytes` of host memory, `copy` called for each piece of it to queue the copies into it: a
  // range of the park pool when it has room, else pinned fresh (the host must be able to hold it:
  // CUDA_ERROR_OUT_OF_MEMORY). The copies are not waited for; on an error, nothing is held.
  struct HostCopy {
    void* host = nullptr;
    bool pooled = false;
  };
  tl::expected<HostCopy, CUresult> copy_to_host(std::uint64_t bytes, CUstream stream,
                                                const ParkPieceFn& copy);
  // Host memory copy_to_host gave, back at once (unpin) or, once a resume no longer needs it,
  // on the heap's thread in `context` (release_host).
  void unpin(void* host, std::uint64_t bytes);
  void release_host(CUcontext context, void* host, std::uint64_t bytes);

  // The handover of memory preemption (memory_policy.cpp), one at a time, run by the coordinator:
  // from start_handover until end_handover, what park releases of other owners is cleared and
  // kept, and `owner`'s allocations larger than kSmallMax are made of it first (whole physical
  // allocations, largest first, as many as fit in the allocation; the rest is created fresh).
  // An allocation of `owner` that finds no room beside what is kept (none of it fits in the
  // allocation) gives it all back to the driver and is tried once more.
  // handover_bytes: what is kept and not taken yet, which the driver does not count as free.
  // end_handover gives back to the driver what was not taken. Any thread with the primary
  // context current.
  // `bytes`, the size of the allocation waited for (0: not known), takes its addresses from the
  // arena at once, for the suspends' views (place_handover_view); its allocation is then made
  // there when its size matches, the views kept there already mapped.
  void start_handover(std::uint64_t owner, std::uint64_t bytes = 0);
  std::uint64_t handover_bytes() const;
  void end_handover();
  // A physical allocation of `bytes` (a multiple of the granularity) that a client being
  // suspended made itself (cuMemCreate, session/vmm_park.hpp), unmapped, its bytes on the host:
  // true when a handover is on for another owner, which now owns it (cleared before it is
  // handed out); false: the caller releases it. It must be exportable as a POSIX fd, as the
  // heap's own are, and plain (no compression). `view`, when not 0, is where the caller mapped
  // the whole of it, read-write, at an address place_handover_view gave: on true the heap owns
  // that mapping too; on false the caller unmaps it and calls forget_handover_view.
  bool keep_for_handover(std::uint64_t from_owner, CUmemGenericAllocationHandle handle,
                         std::uint64_t bytes, CUdeviceptr view = 0);
  // Where a client being suspended (`from_owner`) may map the whole of a physical allocation of
  // `bytes` that it made itself, for the suspend's copy, with `alignment` (its granularity): in
  // the handover's addresses when a handover for another owner prepared them and they have room,
  // else nullopt (the caller takes addresses of the arena). Such a view is either kept
  // (keep_for_handover) or unmapped and then given back with forget_handover_view, which also
  // gives the arena addresses placed in a handover that ended meanwhile.
  std::optional<CUdeviceptr> place_handover_view(std::uint64_t from_owner, std::uint64_t bytes,
                                                 std::uint64_t alignment);
  void forget_handover_view(CUdeviceptr view, std::uint64_t bytes);

  struct Figures {
    std::uint64_t physical_bytes = 0;  // what cuMemCreate holds for this heap
    std::uint64_t parked_bytes = 0;    // blocks of suspended clients, on the host
    std::uint64_t allocations = 0;
    std::uint64_t chunks = 0;
  };
  Figures figures() const;

 private:
  // A physical allocation mapped over part of a block.
  struct Piece {
    CUmemGenericAllocationHandle handle = 0;
    std::uint64_t bytes = 0;
    bool dirty = false;  // kept for a handover with another client's bytes: cleared when taken
  };
  struct Block {
    // Mapped one after another from the block's base: one physical allocation, or several for a
    // block made of handed-over memory. Empty while parked.
    std::vector<Piece> pieces;
    std::uint64_t bytes = 0;  // mapped and created
    std::uint64_t owner = 0;
    bool chunk = false;
    bool exported = false;   // export_block or mark_exported: others may use it
    void* parked = nullptr;  // its bytes on the host while parked (parked_memory.hpp)
    std::map<std::uint64_t, std::uint64_t> free;  // chunks: offset -> length, coalesced
    std::uint64_t live = 0;                       // chunks: allocations in it
  };
  struct Small {
    std::uint64_t chunk = 0;  // the chunk's base
    std::uint64_t length = 0;
  };

  DeviceHeap(const DriverTable& cu, CUdevice device, std::uint64_t base, std::uint64_t bytes,
             std::uint64_t granularity);
  // What the heap's physical allocations are made with: plain device memory that another GPU's
  // server can import (a POSIX fd).
  static CUmemAllocationProp device_prop(CUdevice device);
  static std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
  }
  tl::expected<CUdeviceptr, CUresult> map_block(std::uint64_t bytes, std::uint64_t alignment);
  // A block for the handover's owner: the handover's pieces that fit first, the rest fresh. The
  // handover's pieces go back to it on failure. Falls back to map_block when none fits.
  tl::expected<CUdeviceptr, CUresult> map_handed_block(std::uint64_t bytes,
                                                       std::uint64_t alignment);
  // The block made in the handover's prepared addresses (`parts`, HandoverRange::take, nothing
  // viewing): the kept views as they are mapped, each hole filled with kept unmapped pieces that
  // fit and new memory. On failure the kept views and pieces are back in the handover, unmapped
  // (the addresses go back to the arena).
  tl::expected<CUdeviceptr, CUresult> map_prepared_block(std::vector<HandoverRange::Part> parts,
                                                         std::uint64_t bytes);
  // The handover's prepared addresses given up: kept views unmapped and added to the kept pieces,
  // the addresses back to the arena except those of views still being copied through (their
  // suspends give them back, forget_handover_view).
  void dissolve_prepared();
  // Under mutex_: the kept unmapped pieces, largest first, that fit in `bytes` together; taken
  // out of the handover.
  std::vector<Piece> take_kept_locked(std::uint64_t bytes);
  // Pieces back into the handover's kept ones, or to the driver when it has ended meanwhile (its
  // coordinator stopped waiting for the allocation).
  void return_kept(std::vector<Piece> pieces);
  // Maps `pieces` one after another from `base` with read-write access for the device; on
  // failure unmaps what it mapped (the pieces stay created).
  CUresult map_pieces(CUdeviceptr base, const std::vector<Piece>& pieces);
  // Clears the dirty pieces of a block mapped from `base`, and waits for it.
  CUresult clear_dirty(CUdeviceptr base, const std::vector<Piece>& pieces);
  void unmap_pieces(CUdeviceptr base, const std::vector<Piece>& pieces);
  // The handover's kept memory given back to the driver when `owner`'s allocation found no room
  // beside it: an allocation smaller than every kept piece, or a small one, cannot be made of
  // it, and must not fail for it (it is tried again once). Whether any was given back.
  bool release_kept_for(std::uint64_t owner);
  void release_pieces(const std::vector<Piece>& pieces);
  // Unmaps and releases the block (frees its host copy when parked) and gives its addresses back.
  void unmap_block(CUdeviceptr base, const Block& block);
  // Under mutex_: the owner's blocks, parked or not.
  std::vector<CUdeviceptr> blocks_of_locked(std::uint64_t owner, bool parked) const;
  // Under mutex_: a small allocation in one of the owner's chunks, or 0.
  CUdeviceptr carve_locked(std::uint64_t owner, std::uint64_t length);
  // Under mutex_: takes the chunk out of the books, to be unmapped after the lock.
  std::pair<CUdeviceptr, Block> extract_chunk_locked(CUdeviceptr base);

  const DriverTable& cu_;
  const CUdevice device_;
  const std::uint64_t granularity_;
  AddressArena arena_;
  ParkedReleaser releaser_{cu_};  // resumed clients' host memory, given back (parked_memory.hpp)
  ParkPool* pool_ = nullptr;      // the server's (park_pool.hpp), or none
  mutable std::mutex mutex_;
  std::map<CUdeviceptr, Block> blocks_;         // dedicated allocations and chunks, by base
  std::map<CUdeviceptr, Small> small_;          // allocations inside chunks
  std::map<std::uint64_t, CUdeviceptr> spare_;  // owner -> its empty chunk
  std::multimap<std::uint64_t, CUdeviceptr> chunks_of_;  // owner -> its chunks
  std::set<std::uint64_t> live_owners_;  // allocated since and not forgotten: may keep a spare
  struct Handover {
    std::uint64_t owner = 0;       // whose allocations take it; 0: no handover
    std::uint64_t generation = 0;  // bumped by each start and end
    std::vector<Piece> pieces;     // cleared, unmapped, not taken yet
    HandoverRange prepared;        // the waited allocation's addresses, with views kept there
  };
  Handover handover_;  // under mutex_
};

}  // namespace mpsshim::server

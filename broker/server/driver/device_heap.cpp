#include "broker/server/driver/device_heap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "broker/server/driver/parked_memory.hpp"
#include "common/log.hpp"
#include "proto/address_arenas.hpp"

namespace mpsshim::server {

CUmemAllocationProp DeviceHeap::device_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

std::unique_ptr<DeviceHeap> DeviceHeap::open(const DriverTable& cu, CUdevice device,
                                             unsigned arena_index, std::string* why) {
  if (arena_index >= proto::kMaxArenas) {
    *why = fmt::format("GPU {} has no arena (mpsshim places the memory of {} GPUs per host)",
                       arena_index, proto::kMaxArenas);
    return nullptr;
  }
  const CUmemAllocationProp prop = device_prop(device);
  std::size_t granularity = 0;
  if (CUresult r =
          cu.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS || granularity == 0 || (granularity & (granularity - 1)) != 0) {
    *why = fmt::format("cuMemGetAllocationGranularity: {}", describe(cu, r));
    return nullptr;
  }
  // The whole window, not only this GPU's arena: the driver places its own internal memory right
  // after the last reservation (measured: a reservation asked for at a taken address came back
  // at the first free one after it), which would be inside the next GPU's arena, where this
  // server must later map that GPU's memory at its own addresses (peer access, ops/peer.cpp).
  const std::uint64_t want = proto::kArenaWindowBase;
  CUdeviceptr got = 0;
  if (CUresult r = cu.cuMemAddressReserve(&got, proto::kArenaWindowBytes, granularity, want, 0);
      r != CUDA_SUCCESS) {
    *why = fmt::format("reserving the address window {:#x} + {}: {}", want,
                       format_bytes(proto::kArenaWindowBytes), describe(cu, r));
    return nullptr;
  }
  if (got != want) {
    cu.cuMemAddressFree(got, proto::kArenaWindowBytes);
    *why = fmt::format("the driver placed the address window at {:#x} instead of {:#x}", got, want);
    return nullptr;
  }
  return std::unique_ptr<DeviceHeap>(
      new DeviceHeap(cu, device, proto::arena_base(arena_index), proto::kArenaBytes, granularity));
}

DeviceHeap::DeviceHeap(const DriverTable& cu, CUdevice device, std::uint64_t base,
                       std::uint64_t bytes, std::uint64_t granularity)
    : cu_(cu), device_(device), granularity_(granularity), arena_(base, bytes) {}

DeviceHeap::~DeviceHeap() {
  end_handover();
  for (auto& [base, block] : blocks_) unmap_block(base, block);
  cu_.cuMemAddressFree(proto::kArenaWindowBase, proto::kArenaWindowBytes);
}

CUresult DeviceHeap::map_pieces(CUdeviceptr base, const std::vector<Piece>& pieces) {
  CUmemAccessDesc access{};
  access.location = device_prop(device_).location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::uint64_t offset = 0;
  std::size_t mapped = 0;
  CUresult r = CUDA_SUCCESS;
  for (const Piece& piece : pieces) {
    if (r = cu_.cuMemMap(base + offset, piece.bytes, 0, piece.handle, 0); r != CUDA_SUCCESS) break;
    ++mapped;
    offset += piece.bytes;
  }
  // One call for all: the driver takes "a fully mapped address range containing all
  // allocations", and a preempted PyTorch client's expandable segments are thousands of pieces.
  if (r == CUDA_SUCCESS) r = cu_.cuMemSetAccess(base, offset, &access, 1);
  if (r != CUDA_SUCCESS) {
    unmap_pieces(base, std::vector<Piece>(pieces.begin(), pieces.begin() + mapped));
  }
  return r;
}

// One piece at a time: the driver unmaps whole mappings only.
void DeviceHeap::unmap_pieces(CUdeviceptr base, const std::vector<Piece>& pieces) {
  std::uint64_t offset = 0;
  for (const Piece& piece : pieces) {
    if (CUresult r = cu_.cuMemUnmap(base + offset, piece.bytes); r != CUDA_SUCCESS) {
      log_warn("device heap: cuMemUnmap({:#x}, {}) failed: {}", base + offset, piece.bytes,
               describe(cu_, r));
    }
    offset += piece.bytes;
  }
}

void DeviceHeap::release_pieces(const std::vector<Piece>& pieces) {
  for (const Piece& piece : pieces) {
    if (CUresult r = cu_.cuMemRelease(piece.handle); r != CUDA_SUCCESS) {
      log_warn("device heap: cuMemRelease failed: {}", describe(cu_, r));
    }
  }
}

tl::expected<CUdeviceptr, CUresult> DeviceHeap::map_block(std::uint64_t bytes,
                                                          std::uint64_t alignment) {
  auto address = arena_.take(bytes, std::max(alignment, granularity_));
  if (!address) return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = cu_.cuMemCreate(&handle, bytes, &prop, 0);
  if (r == CUDA_SUCCESS) {
    const std::vector<Piece> pieces{Piece{handle, bytes}};
    if (r = map_pieces(*address, pieces); r == CUDA_SUCCESS) {
      std::lock_guard lock(mutex_);
      Block& block = blocks_[*address];
      block.pieces = pieces;
      block.bytes = bytes;
      return *address;
    }
    cu_.cuMemRelease(handle);
  }
  arena_.give(*address, bytes);
  return tl::unexpected(r);
}

void DeviceHeap::unmap_block(CUdeviceptr base, const Block& block) {
  if (block.parked != nullptr) {
    unpin(block.parked, block.bytes);
    arena_.give(base, block.bytes);
    return;
  }
  unmap_pieces(base, block.pieces);
  release_pieces(block.pieces);
  arena_.give(base, block.bytes);
}

std::pair<CUdeviceptr, DeviceHeap::Block> DeviceHeap::extract_chunk_locked(CUdeviceptr base) {
  auto node = blocks_.extract(base);
  auto [first, last] = chunks_of_.equal_range(node.mapped().owner);
  for (auto it = first; it != last; ++it) {
    if (it->second == base) {
      chunks_of_.erase(it);
      break;
    }
  }
  return {base, std::move(node.mapped())};
}

CUdeviceptr DeviceHeap::carve_locked(std::uint64_t owner, std::uint64_t length) {
  live_owners_.insert(owner);
  auto [first, last] = chunks_of_.equal_range(owner);
  for (auto c = first; c != last; ++c) {
    const CUdeviceptr base = c->second;
    Block& block = blocks_.at(base);
    if (block.parked != nullptr) continue;
    for (auto it = block.free.begin(); it != block.free.end(); ++it) {
      if (it->second < length) continue;
      const std::uint64_t offset = it->first, rest = it->second - length;
      block.free.erase(it);
      if (rest > 0) block.free.emplace(offset + length, rest);
      if (block.live++ == 0) {
        auto spare = spare_.find(owner);
        if (spare != spare_.end() && spare->second == base) spare_.erase(spare);
      }
      small_[base + offset] = Small{base, length};
      return base + offset;
    }
  }
  return 0;
}

tl::expected<CUdeviceptr, CUresult> DeviceHeap::allocate(std::uint64_t owner, std::uint64_t bytes,
                                                         std::uint64_t alignment) {
  if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  }
  if (bytes > kSmallMax || alignment > kSmallAlignment) {
    if (bytes > arena_.bytes()) return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
    bool handed = false;
    {
      std::lock_guard lock(mutex_);
      handed =
          handover_.owner == owner && (!handover_.pieces.empty() || !handover_.prepared.empty());
    }
    const std::uint64_t rounded = round_up(bytes, granularity_);
    auto base = handed ? map_handed_block(rounded, alignment) : map_block(rounded, alignment);
    if (!base && base.error() == CUDA_ERROR_OUT_OF_MEMORY && release_kept_for(owner)) {
      base = map_block(rounded, alignment);
    }
    if (base) {
      std::lock_guard lock(mutex_);
      blocks_[*base].owner = owner;
    }
    return base;
  }
  const std::uint64_t length = round_up(bytes, kSmallAlignment);
  {
    std::lock_guard lock(mutex_);
    if (CUdeviceptr at = carve_locked(owner, length); at != 0) return at;
  }
  // A new chunk, made without the lock; another thread of the same owner may make one too.
  auto chunk = map_block(granularity_, granularity_);
  if (!chunk && chunk.error() == CUDA_ERROR_OUT_OF_MEMORY && release_kept_for(owner)) {
    chunk = map_block(granularity_, granularity_);
  }
  if (!chunk) return chunk;
  std::lock_guard lock(mutex_);
  Block& block = blocks_[*chunk];
  block.owner = owner;
  block.chunk = true;
  chunks_of_.emplace(owner, *chunk);
  block.free.emplace(0, block.bytes);
  return carve_locked(owner, length);
}

bool DeviceHeap::owns(CUdeviceptr base) const {
  std::lock_guard lock(mutex_);
  if (small_.count(base) != 0) return true;
  auto it = blocks_.find(base);
  return it != blocks_.end() && !it->second.chunk;
}

CUresult DeviceHeap::free(CUdeviceptr base) {
  std::vector<std::pair<CUdeviceptr, Block>> unmap;
  {
    std::lock_guard lock(mutex_);
    if (auto small = small_.find(base); small != small_.end()) {
      const Small s = small->second;
      small_.erase(small);
      Block& chunk = blocks_.at(s.chunk);
      std::uint64_t offset = base - s.chunk, length = s.length;
      auto next = chunk.free.lower_bound(offset);
      if (next != chunk.free.end() && offset + length == next->first) {
        length += next->second;
        next = chunk.free.erase(next);
      }
      if (next != chunk.free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          offset = prev->first;
          length += prev->second;
          chunk.free.erase(prev);
        }
      }
      chunk.free.emplace(offset, length);
      if (--chunk.live == 0) {
        // A live owner's first empty chunk stays as its spare; any other goes back to the driver.
        const bool keep = live_owners_.count(chunk.owner) != 0 &&
                          spare_.try_emplace(chunk.owner, s.chunk).first->second == s.chunk;
        if (!keep) unmap.push_back(extract_chunk_locked(s.chunk));
      }
    } else {
      auto it = blocks_.find(base);
      if (it == blocks_.end() || it->second.chunk) return CUDA_ERROR_INVALID_VALUE;
      auto node = blocks_.extract(it);
      unmap.emplace_back(node.key(), std::move(node.mapped()));
    }
  }
  for (auto& [at, block] : unmap) unmap_block(at, block);
  return CUDA_SUCCESS;
}

tl::expected<DeviceHeap::Exported, CUresult> DeviceHeap::export_block(std::uint64_t owner,
                                                                      CUdeviceptr address) {
  // Under the lock: another worker may be freeing the block (the last opener of an IPC export).
  std::lock_guard lock(mutex_);
  auto after = blocks_.upper_bound(address);
  if (after == blocks_.begin()) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  auto it = std::prev(after);
  if (address - it->first >= it->second.bytes || it->second.owner != owner) {
    return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  }
  if (it->second.parked != nullptr) return tl::unexpected(CUDA_ERROR_NOT_READY);
  std::uint64_t offset = 0;
  const Piece* holding = nullptr;
  for (const Piece& piece : it->second.pieces) {
    if (address - it->first < offset + piece.bytes) {
      holding = &piece;
      break;
    }
    offset += piece.bytes;
  }
  if (holding == nullptr) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  if (CUresult r = cu_.cuMemExportToShareableHandle(&fd, holding->handle,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    return tl::unexpected(r);
  }
  it->second.exported = true;
  return Exported{it->first + offset, holding->bytes, fd};
}

void DeviceHeap::forget_owner(std::uint64_t owner) {
  std::vector<std::pair<CUdeviceptr, Block>> unmap;
  {
    std::lock_guard lock(mutex_);
    spare_.erase(owner);
    live_owners_.erase(owner);
    std::vector<CUdeviceptr> empty;
    auto [first, last] = chunks_of_.equal_range(owner);
    for (auto it = first; it != last; ++it) {
      if (blocks_.at(it->second).live == 0) empty.push_back(it->second);
    }
    for (CUdeviceptr base : empty) unmap.push_back(extract_chunk_locked(base));
  }
  for (auto& [at, block] : unmap) unmap_block(at, block);
}

bool DeviceHeap::exported(std::uint64_t owner) const {
  std::lock_guard lock(mutex_);
  for (const auto& [base, block] : blocks_) {
    if (block.owner == owner && block.exported) return true;
  }
  return false;
}

void DeviceHeap::mark_exported(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto after = blocks_.upper_bound(address);
  if (after == blocks_.begin()) return;
  auto it = std::prev(after);
  if (address - it->first < it->second.bytes) it->second.exported = true;
}

std::vector<CUdeviceptr> DeviceHeap::blocks_of_locked(std::uint64_t owner, bool parked) const {
  std::vector<CUdeviceptr> out;
  for (const auto& [base, block] : blocks_) {
    if (block.owner == owner && (block.parked != nullptr) == parked) out.push_back(base);
  }
  return out;
}

tl::expected<DeviceHeap::Parked, CUresult> DeviceHeap::park(std::uint64_t owner, CUstream stream) {
  struct Copy {
    CUdeviceptr base = 0;
    std::uint64_t bytes = 0;
    std::vector<Piece> pieces;
    void* host = nullptr;
  };
  std::vector<Copy> copies;
  std::vector<std::pair<CUdeviceptr, Block>> spare;
  bool hand_over = false;
  std::uint64_t handover_generation = 0;
  {
    std::lock_guard lock(mutex_);
    hand_over = handover_.owner != 0 && handover_.owner != owner;
    handover_generation = handover_.generation;
    // The empty spare chunk holds nothing worth keeping: it goes back to the driver.
    if (auto it = spare_.find(owner); it != spare_.end()) {
      spare.push_back(extract_chunk_locked(it->second));
      spare_.erase(it);
    }
    for (CUdeviceptr base : blocks_of_locked(owner, false)) {
      const Block& block = blocks_.at(base);
      copies.push_back(Copy{base, block.bytes, block.pieces, nullptr});
    }
  }
  for (auto& [at, block] : spare) unmap_block(at, block);
  // The pool's ranges first; what it has no range for is faulted in fresh, and the host must
  // have room for that.
  std::uint64_t fresh = 0;
  for (Copy& c : copies) {
    c.host = pool_ != nullptr ? pool_->take(c.bytes) : nullptr;
    if (c.host == nullptr) fresh += c.bytes;
  }
  if (fresh != 0 && !host_can_hold(fresh)) {
    for (Copy& c : copies) {
      if (c.host != nullptr) pool_->give(c.host, c.bytes);
    }
    return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  // Each piece's copy runs while the next piece is pinned (parked_memory.hpp).
  CUresult failed = CUDA_SUCCESS;
  for (Copy& c : copies) {
    auto copy_piece = [&](void* piece, std::uint64_t offset, std::uint64_t bytes) {
      return cu_.cuMemcpyDtoHAsync_v2(piece, c.base + offset, bytes, stream);
    };
    if (c.host != nullptr) {
      failed = for_each_parked_piece(c.host, c.bytes, copy_piece);
    } else if (auto host = pin_parked(cu_, c.bytes, stream, copy_piece)) {
      c.host = *host;
    } else {
      failed = host.error();
    }
    if (failed != CUDA_SUCCESS) break;
  }
  if (CUresult r = cu_.cuStreamSynchronize(stream); failed == CUDA_SUCCESS) failed = r;
  if (failed != CUDA_SUCCESS) {
    for (Copy& c : copies) {
      if (c.host != nullptr) unpin(c.host, c.bytes);
    }
    return tl::unexpected(failed);
  }
  // Memory handed to another client holds none of this one's bytes: cleared once they are all
  // on the host. Memory that could not be cleared is released as without a handover.
  if (hand_over) {
    CUresult cleared = CUDA_SUCCESS;
    for (const Copy& c : copies) {
      if (cleared = cu_.cuMemsetD8Async(c.base, 0, c.bytes, stream); cleared != CUDA_SUCCESS) break;
    }
    if (CUresult r = cu_.cuStreamSynchronize(stream); cleared == CUDA_SUCCESS) cleared = r;
    if (cleared != CUDA_SUCCESS) {
      log_warn("device heap: clearing parked memory to hand it over failed: {}",
               describe(cu_, cleared));
      hand_over = false;
    }
  }
  Parked parked;
  std::vector<Piece> released;
  for (const Copy& c : copies) {
    // A block still mapped could not be mapped again at resume: it stays on the device, whole.
    std::uint64_t offset = 0;
    std::size_t unmapped = 0;
    CUresult r = CUDA_SUCCESS;
    for (const Piece& piece : c.pieces) {
      if (r = cu_.cuMemUnmap(c.base + offset, piece.bytes); r != CUDA_SUCCESS) break;
      offset += piece.bytes;
      ++unmapped;
    }
    if (r != CUDA_SUCCESS) {
      log_warn(
          "device heap: cuMemUnmap({:#x}, {}) of a block to park failed, so it stays on the "
          "device: {}",
          c.base + offset, c.pieces[unmapped].bytes, describe(cu_, r));
      map_pieces(c.base, std::vector<Piece>(c.pieces.begin(), c.pieces.begin() + unmapped));
      // Cleared for the handover: its bytes go back from the host copy first.
      if (hand_over) {
        for_each_parked_piece(c.host, c.bytes,
                              [&](void* piece, std::uint64_t at, std::uint64_t bytes) {
                                return cu_.cuMemcpyHtoDAsync_v2(c.base + at, piece, bytes, stream);
                              });
        cu_.cuStreamSynchronize(stream);
      }
      unpin(c.host, c.bytes);
      continue;
    }
    released.insert(released.end(), c.pieces.begin(), c.pieces.end());
    std::lock_guard lock(mutex_);
    Block& block = blocks_.at(c.base);
    block.pieces.clear();
    block.parked = c.host;
    parked.bytes += c.bytes;
    if (pool_ != nullptr && pool_->holds(c.host)) parked.pooled += c.bytes;
  }
  if (hand_over) {
    std::lock_guard lock(mutex_);
    // The handover may have ended meanwhile (its coordinator gave up waiting for this suspend).
    if (handover_.owner != 0 && handover_.generation == handover_generation) {
      handover_.pieces.insert(handover_.pieces.end(), released.begin(), released.end());
      released.clear();
    }
  }
  release_pieces(released);
  return parked;
}

tl::expected<std::uint64_t, CUresult> DeviceHeap::unpark(std::uint64_t owner, CUstream stream,
                                                         CUcontext context) {
  struct Copy {
    CUdeviceptr base = 0;
    std::uint64_t bytes = 0;
    void* host = nullptr;
    CUmemGenericAllocationHandle handle = 0;
    bool mapped = false;
  };
  std::vector<Copy> copies;
  {
    std::lock_guard lock(mutex_);
    for (CUdeviceptr base : blocks_of_locked(owner, true)) {
      const Block& block = blocks_.at(base);
      copies.push_back(Copy{base, block.bytes, block.parked, 0, false});
    }
  }
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // Every block gets its device memory before any byte moves: all or nothing.
  CUresult failed = CUDA_SUCCESS;
  for (Copy& c : copies) {
    if (failed = cu_.cuMemCreate(&c.handle, c.bytes, &prop, 0); failed != CUDA_SUCCESS) {
      c.handle = 0;
      break;
    }
    if (failed = cu_.cuMemMap(c.base, c.bytes, 0, c.handle, 0); failed != CUDA_SUCCESS) break;
    c.mapped = true;
    if (failed = cu_.cuMemSetAccess(c.base, c.bytes, &access, 1); failed != CUDA_SUCCESS) break;
  }
  if (failed == CUDA_SUCCESS) {
    for (const Copy& c : copies) {
      // Piece by piece: each is registered on its own (parked_memory.hpp).
      failed = for_each_parked_piece(
          c.host, c.bytes, [&](void* piece, std::uint64_t offset, std::uint64_t bytes) {
            return cu_.cuMemcpyHtoDAsync_v2(c.base + offset, piece, bytes, stream);
          });
      if (failed != CUDA_SUCCESS) break;
    }
    if (CUresult r = cu_.cuStreamSynchronize(stream); failed == CUDA_SUCCESS) failed = r;
  }
  if (failed != CUDA_SUCCESS) {
    for (const Copy& c : copies) {
      if (c.mapped) cu_.cuMemUnmap(c.base, c.bytes);
      if (c.handle != 0) cu_.cuMemRelease(c.handle);
    }
    return tl::unexpected(failed);
  }
  std::uint64_t back = 0;
  for (const Copy& c : copies) {
    // The pool's memory is back in the pool at once; fresh memory is unpinned on the releaser's
    // thread.
    if (pool_ != nullptr && pool_->holds(c.host)) {
      pool_->give(c.host, c.bytes);
    } else {
      releaser_.release(context, c.host, c.bytes);
    }
    std::lock_guard lock(mutex_);
    Block& block = blocks_.at(c.base);
    block.pieces = {Piece{c.handle, c.bytes}};
    block.parked = nullptr;
    back += c.bytes;
  }
  return back;
}

tl::expected<DeviceHeap::HostCopy, CUresult> DeviceHeap::copy_to_host(std::uint64_t bytes,
                                                                      CUstream stream,
                                                                      const ParkPieceFn& copy) {
  if (void* host = pool_ != nullptr ? pool_->take(bytes) : nullptr) {
    if (CUresult r = for_each_parked_piece(host, bytes, copy); r != CUDA_SUCCESS) {
      cu_.cuStreamSynchronize(stream);  // nothing may still write into the range given back
      pool_->give(host, bytes);
      return tl::unexpected(r);
    }
    return HostCopy{host, true};
  }
  if (!host_can_hold(bytes)) return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  auto host = pin_parked(cu_, bytes, stream, copy);
  if (!host) return tl::unexpected(host.error());
  return HostCopy{*host, false};
}

void DeviceHeap::release_host(CUcontext context, void* host, std::uint64_t bytes) {
  if (pool_ != nullptr && pool_->holds(host)) {
    pool_->give(host, bytes);
  } else {
    releaser_.release(context, host, bytes);
  }
}

void DeviceHeap::unpin(void* host, std::uint64_t bytes) {
  if (pool_ != nullptr && pool_->holds(host)) {
    pool_->give(host, bytes);
  } else {
    unpin_parked(cu_, host, bytes);
  }
}

DeviceHeap::Figures DeviceHeap::figures() const {
  std::lock_guard lock(mutex_);
  Figures f;
  for (const auto& [base, block] : blocks_) {
    (block.parked != nullptr ? f.parked_bytes : f.physical_bytes) += block.bytes;
    f.chunks += block.chunk ? 1 : 0;
    f.allocations += block.chunk ? 0 : 1;
  }
  f.allocations += small_.size();
  return f;
}

}  // namespace mpsshim::server

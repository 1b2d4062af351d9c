// Memory preemption's handover (device_heap.hpp): the physical memory of the clients suspended for
// an allocation becomes that allocation, cleared, instead of going back to the driver.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "broker/server/driver/device_heap.hpp"
#include "broker/server/driver/driver.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

using Clock = std::chrono::steady_clock;

double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Unmaps a view kept in a handover's prepared addresses and gives the addresses back to the
// arena. False when the driver would not unmap it: still mapped, its addresses stay taken, never
// handed out again, and the caller releases its memory with them.
bool unmap_kept_view(const DriverTable& cu, AddressArena& arena, const HandoverRange::Part& part) {
  if (CUresult r = cu.cuMemUnmap(part.at, part.bytes); r != CUDA_SUCCESS) {
    log_warn("device heap: cuMemUnmap({:#x}, {}) of memory kept for a handover failed: {}", part.at,
             part.bytes, describe(cu, r));
    return false;
  }
  arena.give(part.at, part.bytes);
  return true;
}

}  // namespace

void DeviceHeap::start_handover(std::uint64_t owner, std::uint64_t bytes) {
  dissolve_prepared();  // an earlier handover's, should it not have ended
  // The allocation's addresses, taken before any suspend places a view in them.
  std::optional<std::uint64_t> at;
  const std::uint64_t rounded = round_up(bytes, granularity_);
  if (bytes > kSmallMax && rounded <= arena_.bytes()) at = arena_.take(rounded, granularity_);
  std::lock_guard lock(mutex_);
  handover_.owner = owner;
  ++handover_.generation;
  if (at) handover_.prepared.reset(*at, rounded);
}

std::uint64_t DeviceHeap::handover_bytes() const {
  std::lock_guard lock(mutex_);
  std::uint64_t bytes = handover_.prepared.kept_bytes();
  for (const Piece& piece : handover_.pieces) bytes += piece.bytes;
  return bytes;
}

bool DeviceHeap::keep_for_handover(std::uint64_t from_owner, CUmemGenericAllocationHandle handle,
                                   std::uint64_t bytes, CUdeviceptr view) {
  if (bytes == 0 || bytes % granularity_ != 0) return false;
  std::lock_guard lock(mutex_);
  if (handover_.owner == 0 || handover_.owner == from_owner) return false;
  if (view != 0) return handover_.prepared.keep(view, handle);
  handover_.pieces.push_back(Piece{handle, bytes, true});
  return true;
}

std::optional<CUdeviceptr> DeviceHeap::place_handover_view(std::uint64_t from_owner,
                                                           std::uint64_t bytes,
                                                           std::uint64_t alignment) {
  if (bytes == 0 || bytes % granularity_ != 0) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (handover_.owner == 0 || handover_.owner == from_owner) return std::nullopt;
  return handover_.prepared.place(bytes, std::max(alignment, granularity_));
}

void DeviceHeap::forget_handover_view(CUdeviceptr view, std::uint64_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (handover_.prepared.forget(view)) return;  // a hole of the prepared addresses now
  }
  arena_.give(view, bytes);  // placed in a handover that has ended
}

std::vector<DeviceHeap::Piece> DeviceHeap::take_kept_locked(std::uint64_t bytes) {
  std::vector<Piece>& kept = handover_.pieces;
  std::sort(kept.begin(), kept.end(),
            [](const Piece& a, const Piece& b) { return a.bytes > b.bytes; });
  std::vector<Piece> taken, rest;
  std::uint64_t handed = 0;
  for (const Piece& piece : kept) {
    if (handed + piece.bytes <= bytes) {
      handed += piece.bytes;
      taken.push_back(piece);
    } else {
      rest.push_back(piece);
    }
  }
  kept.swap(rest);
  return taken;
}

void DeviceHeap::return_kept(std::vector<Piece> pieces) {
  {
    std::lock_guard lock(mutex_);
    if (handover_.owner != 0) {
      handover_.pieces.insert(handover_.pieces.end(), pieces.begin(), pieces.end());
      return;
    }
  }
  release_pieces(pieces);  // the handover ended meanwhile (its coordinator stopped waiting)
}

void DeviceHeap::dissolve_prepared() {
  std::vector<HandoverRange::Part> parts;
  {
    std::lock_guard lock(mutex_);
    if (handover_.prepared.empty()) return;
    parts = handover_.prepared.take();
  }
  std::vector<Piece> unmapped;
  for (const HandoverRange::Part& part : parts) {
    if (part.kind == HandoverRange::Part::Kind::kViewing) continue;  // its suspend gives it back
    if (part.kind == HandoverRange::Part::Kind::kHole) {
      arena_.give(part.at, part.bytes);
    } else if (unmap_kept_view(cu_, arena_, part)) {
      unmapped.push_back(Piece{part.handle, part.bytes, true});
    } else {
      release_pieces({Piece{part.handle, part.bytes}});
    }
  }
  if (!unmapped.empty()) return_kept(std::move(unmapped));
}

CUresult DeviceHeap::clear_dirty(CUdeviceptr base, const std::vector<Piece>& pieces) {
  if (std::none_of(pieces.begin(), pieces.end(), [](const Piece& p) { return p.dirty; })) {
    return CUDA_SUCCESS;
  }
  // On the current context's NULL stream (the primary context's, where the server's clients
  // have no work): handovers are rare, and the caller has no stream of its own to give. One
  // memset per run of dirty pieces: a preempted PyTorch client's are thousands of 20 MiB.
  CUstream stream = nullptr;
  CUresult r = CUDA_SUCCESS;
  std::uint64_t offset = 0, run_start = 0, run_bytes = 0;
  auto flush = [&] {
    if (run_bytes != 0 && r == CUDA_SUCCESS) {
      r = cu_.cuMemsetD8Async(base + run_start, 0, run_bytes, stream);
    }
    run_bytes = 0;
  };
  for (const Piece& piece : pieces) {
    if (!piece.dirty) {
      flush();
    } else {
      if (run_bytes == 0) run_start = offset;
      run_bytes += piece.bytes;
    }
    offset += piece.bytes;
  }
  flush();
  if (CUresult synced = cu_.cuStreamSynchronize(stream); r == CUDA_SUCCESS) r = synced;
  return r;
}

tl::expected<CUdeviceptr, CUresult> DeviceHeap::map_handed_block(std::uint64_t bytes,
                                                                 std::uint64_t alignment) {
  std::vector<HandoverRange::Part> parts;
  {
    std::lock_guard lock(mutex_);
    const HandoverRange& prepared = handover_.prepared;
    if (!prepared.empty() && prepared.bytes() == bytes &&
        prepared.base() % std::max(alignment, granularity_) == 0 && !prepared.viewing()) {
      parts = handover_.prepared.take();
    }
  }
  if (!parts.empty()) return map_prepared_block(std::move(parts), bytes);
  // Not the allocation the addresses were prepared for, or a suspend is still copying there.
  dissolve_prepared();
  std::vector<Piece> pieces;
  {
    std::lock_guard lock(mutex_);
    pieces = take_kept_locked(bytes);
  }
  if (pieces.empty()) return map_block(bytes, alignment);
  std::uint64_t handed = 0;
  for (const Piece& piece : pieces) handed += piece.bytes;
  auto give_back = [&](CUresult r) {
    return_kept(pieces);
    return tl::unexpected(r);
  };
  auto address = arena_.take(bytes, std::max(alignment, granularity_));
  if (!address) return give_back(CUDA_ERROR_OUT_OF_MEMORY);
  const std::size_t handed_pieces = pieces.size();
  CUresult r = CUDA_SUCCESS;
  if (handed < bytes) {
    const CUmemAllocationProp prop = device_prop(device_);
    CUmemGenericAllocationHandle fresh = 0;
    r = cu_.cuMemCreate(&fresh, bytes - handed, &prop, 0);
    if (r == CUDA_SUCCESS) pieces.push_back(Piece{fresh, bytes - handed});
  }
  const auto started = Clock::now();
  auto mapped = started, cleared = started;
  if (r == CUDA_SUCCESS) {
    if (r = map_pieces(*address, pieces); r == CUDA_SUCCESS) {
      mapped = Clock::now();
      // Another client's bytes are never seen: a failed clearing hands nothing out.
      if (r = clear_dirty(*address, pieces); r != CUDA_SUCCESS) unmap_pieces(*address, pieces);
      cleared = Clock::now();
    }
  }
  if (r != CUDA_SUCCESS) {
    if (pieces.size() > handed_pieces) release_pieces({pieces.back()});
    pieces.resize(handed_pieces);
    arena_.give(*address, bytes);
    return give_back(r);
  }
  const std::size_t dirty = static_cast<std::size_t>(
      std::count_if(pieces.begin(), pieces.end(), [](const Piece& p) { return p.dirty; }));
  log_info(
      "device heap: {} at {:#x} made of {} of memory taken from preempted clients and {} new: "
      "{} physical allocations mapped in {:.1f} ms, {} of them cleared in {:.1f} ms",
      format_bytes(bytes), *address, format_bytes(handed), format_bytes(bytes - handed),
      pieces.size(), ms(mapped - started), dirty, ms(cleared - mapped));
  for (Piece& piece : pieces) piece.dirty = false;
  std::lock_guard lock(mutex_);
  Block& block = blocks_[*address];
  block.pieces = std::move(pieces);
  block.bytes = bytes;
  return *address;
}

tl::expected<CUdeviceptr, CUresult> DeviceHeap::map_prepared_block(
    std::vector<HandoverRange::Part> parts, std::uint64_t bytes) {
  const CUdeviceptr base = parts.front().at;
  // Each hole: kept unmapped pieces that fit (the heap's own parked blocks), then new memory.
  struct Fill {
    CUdeviceptr at = 0;
    std::uint64_t bytes = 0;
    std::vector<Piece> pieces;
    std::size_t handed = 0;  // the first `handed` pieces are kept ones
    bool mapped = false;
  };
  std::vector<Fill> fills;
  {
    std::lock_guard lock(mutex_);
    for (const HandoverRange::Part& part : parts) {
      if (part.kind != HandoverRange::Part::Kind::kHole) continue;
      Fill fill{part.at, part.bytes, take_kept_locked(part.bytes)};
      fill.handed = fill.pieces.size();
      fills.push_back(std::move(fill));
    }
  }
  const auto started = Clock::now();
  const CUmemAllocationProp prop = device_prop(device_);
  CUresult r = CUDA_SUCCESS;
  std::uint64_t fresh = 0;
  for (Fill& fill : fills) {
    std::uint64_t have = 0;
    for (const Piece& piece : fill.pieces) have += piece.bytes;
    if (have < fill.bytes) {
      CUmemGenericAllocationHandle handle = 0;
      if (r = cu_.cuMemCreate(&handle, fill.bytes - have, &prop, 0); r != CUDA_SUCCESS) break;
      fill.pieces.push_back(Piece{handle, fill.bytes - have});
      fresh += fill.bytes - have;
    }
    if (r = map_pieces(fill.at, fill.pieces); r != CUDA_SUCCESS) break;
    fill.mapped = true;
  }
  const auto mapped = Clock::now();
  // The block's pieces in address order: the kept views as they are, the holes as filled.
  std::vector<Piece> pieces;
  std::size_t views = 0, next_fill = 0;
  for (const HandoverRange::Part& part : parts) {
    if (part.kind == HandoverRange::Part::Kind::kKept) {
      pieces.push_back(Piece{part.handle, part.bytes, true});
      ++views;
    } else {
      const Fill& fill = fills[next_fill++];
      pieces.insert(pieces.end(), fill.pieces.begin(), fill.pieces.end());
    }
  }
  // Another client's bytes are never seen: a failed clearing hands nothing out.
  if (r == CUDA_SUCCESS) r = clear_dirty(base, pieces);
  const auto cleared = Clock::now();
  if (r != CUDA_SUCCESS) {
    // Everything back as it was before the handover mapped it: kept pieces unmapped and kept, new
    // memory released, the addresses back to the arena.
    std::vector<Piece> back;
    for (Fill& fill : fills) {
      if (fill.mapped) unmap_pieces(fill.at, fill.pieces);
      if (fill.pieces.size() > fill.handed) release_pieces({fill.pieces.back()});
      back.insert(back.end(), fill.pieces.begin(), fill.pieces.begin() + fill.handed);
      arena_.give(fill.at, fill.bytes);
    }
    for (const HandoverRange::Part& part : parts) {
      if (part.kind != HandoverRange::Part::Kind::kKept) continue;
      if (unmap_kept_view(cu_, arena_, part)) {
        back.push_back(Piece{part.handle, part.bytes, true});
      } else {
        release_pieces({Piece{part.handle, part.bytes}});
      }
    }
    return_kept(std::move(back));
    return tl::unexpected(r);
  }
  std::size_t dirty = 0;
  for (Piece& piece : pieces) {
    dirty += piece.dirty ? 1 : 0;
    piece.dirty = false;
  }
  log_info(
      "device heap: {} at {:#x} made of {} of memory taken from preempted clients and {} new: "
      "{} physical allocations, {} of them mapped there by their clients' suspends; the rest "
      "mapped in {:.1f} ms, {} cleared in {:.1f} ms",
      format_bytes(bytes), base, format_bytes(bytes - fresh), format_bytes(fresh), pieces.size(),
      views, ms(mapped - started), dirty, ms(cleared - mapped));
  std::lock_guard lock(mutex_);
  Block& block = blocks_[base];
  block.pieces = std::move(pieces);
  block.bytes = bytes;
  return base;
}

bool DeviceHeap::release_kept_for(std::uint64_t owner) {
  {
    std::lock_guard lock(mutex_);
    if (handover_.owner != owner) return false;
  }
  dissolve_prepared();
  std::vector<Piece> kept;
  {
    std::lock_guard lock(mutex_);
    if (handover_.owner != owner) return false;
    kept.swap(handover_.pieces);
  }
  release_pieces(kept);
  return !kept.empty();
}

void DeviceHeap::end_handover() {
  dissolve_prepared();
  std::vector<Piece> left;
  {
    std::lock_guard lock(mutex_);
    handover_.owner = 0;
    ++handover_.generation;
    left.swap(handover_.pieces);
  }
  release_pieces(left);
}

}  // namespace mpsshim::server

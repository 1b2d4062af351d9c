#include "broker/server/driver/address_arena.hpp"

#include <iterator>

namespace mpsshim::server {

AddressArena::AddressArena(std::uint64_t base, std::uint64_t bytes) : base_(base), bytes_(bytes) {
  if (bytes > 0) free_.emplace(base, bytes);
}

std::optional<std::uint64_t> AddressArena::take(std::uint64_t bytes, std::uint64_t alignment) {
  if (bytes == 0 || bytes > bytes_ || alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return std::nullopt;
  }
  std::lock_guard lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::uint64_t start = (it->first + alignment - 1) & ~(alignment - 1);
    const std::uint64_t skipped = start - it->first;
    if (start < it->first || skipped >= it->second || it->second - skipped < bytes) continue;
    const std::uint64_t block = it->first, length = it->second;
    free_.erase(it);
    if (skipped > 0) free_.emplace(block, skipped);
    if (length - skipped > bytes) free_.emplace(start + bytes, length - skipped - bytes);
    taken_ += bytes;
    return start;
  }
  return std::nullopt;
}

bool AddressArena::take_at(std::uint64_t address, std::uint64_t bytes) {
  if (bytes == 0 || !holds(address) || bytes > base_ + bytes_ - address) return false;
  std::lock_guard lock(mutex_);
  auto after = free_.upper_bound(address);
  if (after == free_.begin()) return false;
  auto it = std::prev(after);
  const std::uint64_t block = it->first, length = it->second;
  if (address - block >= length || bytes > length - (address - block)) return false;
  free_.erase(it);
  if (address > block) free_.emplace(block, address - block);
  const std::uint64_t end = address + bytes;
  if (block + length > end) free_.emplace(end, block + length - end);
  taken_ += bytes;
  return true;
}

void AddressArena::give(std::uint64_t address, std::uint64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard lock(mutex_);
  taken_ -= bytes;
  auto next = free_.lower_bound(address);
  if (next != free_.end() && address + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == address) {
      address = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(address, bytes);
}

std::uint64_t AddressArena::taken_bytes() const {
  std::lock_guard lock(mutex_);
  return taken_;
}

}  // namespace mpsshim::server

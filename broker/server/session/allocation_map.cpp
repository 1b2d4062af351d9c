#include "broker/server/session/allocation_map.hpp"

#include <limits>

namespace mpsshim::server {

bool AllocationMap::add(const DeviceRange& range) {
  if (range.bytes > std::numeric_limits<std::uint64_t>::max() - range.base) return false;
  if (!ranges_.emplace(range.base, range).second) return false;
  ++by_kind_[static_cast<std::size_t>(range.kind)];
  return true;
}

bool AllocationMap::contains(std::uint64_t p, std::uint64_t n) const {
  if (n == 0) return true;
  if (n > std::numeric_limits<std::uint64_t>::max() - p) return false;
  auto after = ranges_.upper_bound(p);
  if (after == ranges_.begin()) return false;
  const DeviceRange* range = &std::prev(after)->second;
  std::uint64_t offset = p - range->base;
  if (offset >= range->bytes) return false;
  // Walk on through mappings that continue exactly where the last one ended: the client's own
  // (kMapped), or another GPU's allocation mapped a physical allocation at a time (kPeer: one its
  // server made of several, device_heap.hpp).
  while (n > range->bytes - offset) {
    const bool runs_on = range->kind == RangeKind::kMapped || range->kind == RangeKind::kPeer;
    if (!runs_on || after == ranges_.end()) return false;
    const DeviceRange& next = after->second;
    if (next.kind != range->kind || next.base != range->base + range->bytes) return false;
    n -= range->bytes - offset;
    offset = 0;
    range = &next;
    ++after;
  }
  return true;
}

const DeviceRange* AllocationMap::find(std::uint64_t base) const {
  auto it = ranges_.find(base);
  return it == ranges_.end() ? nullptr : &it->second;
}

const DeviceRange* AllocationMap::find_containing(std::uint64_t address) const {
  auto after = ranges_.upper_bound(address);
  if (after == ranges_.begin()) return nullptr;
  const DeviceRange& range = std::prev(after)->second;
  return address - range.base < range.bytes ? &range : nullptr;
}

std::optional<DeviceRange> AllocationMap::remove(std::uint64_t base) {
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return std::nullopt;
  DeviceRange out = it->second;
  --by_kind_[static_cast<std::size_t>(out.kind)];
  ranges_.erase(it);
  return out;
}

std::vector<DeviceRange> AllocationMap::remove_if(
    const std::function<bool(const DeviceRange&)>& pred) {
  std::vector<DeviceRange> removed;
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    if (pred(it->second)) {
      removed.push_back(it->second);
      --by_kind_[static_cast<std::size_t>(it->second.kind)];
      it = ranges_.erase(it);
    } else {
      ++it;
    }
  }
  return removed;
}

}  // namespace mpsshim::server

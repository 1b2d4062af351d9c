#include "broker/server/driver/handover_range.hpp"

namespace mpsshim::server {

void HandoverRange::reset(CUdeviceptr base, std::uint64_t bytes) {
  base_ = base;
  bytes_ = bytes;
  next_ = 0;
  slots_.clear();
}

std::optional<CUdeviceptr> HandoverRange::place(std::uint64_t bytes, std::uint64_t alignment) {
  if (empty() || bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return std::nullopt;
  }
  const CUdeviceptr at = (base_ + next_ + alignment - 1) & ~(alignment - 1);
  if (at < base_ + next_ || at - base_ > bytes_ || bytes > bytes_ - (at - base_)) {
    return std::nullopt;
  }
  slots_.emplace(at, Slot{bytes, 0});
  next_ = at - base_ + bytes;
  return at;
}

bool HandoverRange::keep(CUdeviceptr at, CUmemGenericAllocationHandle handle) {
  auto it = slots_.find(at);
  if (it == slots_.end() || it->second.handle != 0 || handle == 0) return false;
  it->second.handle = handle;
  return true;
}

bool HandoverRange::forget(CUdeviceptr at) {
  if (empty() || at - base_ >= bytes_) return false;
  slots_.erase(at);
  return true;
}

bool HandoverRange::viewing() const {
  for (const auto& [at, slot] : slots_) {
    if (slot.handle == 0) return true;
  }
  return false;
}

std::uint64_t HandoverRange::kept_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& [at, slot] : slots_) bytes += slot.handle != 0 ? slot.bytes : 0;
  return bytes;
}

std::size_t HandoverRange::kept_count() const {
  std::size_t count = 0;
  for (const auto& [at, slot] : slots_) count += slot.handle != 0 ? 1 : 0;
  return count;
}

std::vector<HandoverRange::Part> HandoverRange::take() {
  std::vector<Part> parts;
  CUdeviceptr cursor = base_;
  for (const auto& [at, slot] : slots_) {
    if (at > cursor) parts.push_back(Part{cursor, at - cursor, Part::Kind::kHole, 0});
    parts.push_back(Part{at, slot.bytes,
                         slot.handle != 0 ? Part::Kind::kKept : Part::Kind::kViewing, slot.handle});
    cursor = at + slot.bytes;
  }
  if (cursor < base_ + bytes_) {
    parts.push_back(Part{cursor, base_ + bytes_ - cursor, Part::Kind::kHole, 0});
  }
  reset(0, 0);
  return parts;
}

}  // namespace mpsshim::server

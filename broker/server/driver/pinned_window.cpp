#include "broker/server/driver/pinned_window.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <iterator>

#include "common/log.hpp"
#include "proto/address_arenas.hpp"
#include "proto/address_reservation.hpp"

namespace mpsshim::server {

std::unique_ptr<PinnedWindow> PinnedWindow::open(unsigned ordinal, std::string* why) {
  if (ordinal >= proto::kMaxArenas) {
    if (why) *why = "GPU ordinal beyond the window's slices";
    return nullptr;
  }
  if (!proto::reserve_range(proto::kPinnedWindowBase, proto::kPinnedWindowBytes, why)) {
    return nullptr;
  }
  return std::make_unique<PinnedWindow>(ordinal);
}

PinnedWindow::PinnedWindow(unsigned ordinal)
    : slice_(proto::pinned_slice_base(ordinal), proto::kPinnedSliceBytes) {}

void* PinnedWindow::map(int fd, std::uint64_t bytes) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  auto address = slice_.take(bytes, page);
  if (!address) return nullptr;
  void* want = reinterpret_cast<void*>(*address);
  // MAP_FIXED replaces this process's own PROT_NONE reservation, nothing else.
  void* at = ::mmap(want, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (at == want) return at;
  slice_.give(*address, bytes);
  return nullptr;
}

void* PinnedWindow::map_foreign(int fd, std::uint64_t address, std::uint64_t bytes) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t end = proto::kPinnedWindowBase + proto::kPinnedWindowBytes;
  if (address % page != 0 || bytes == 0 || address < proto::kPinnedWindowBase || address >= end ||
      bytes > end - address || slice_.holds(address) || slice_.holds(address + bytes - 1) ||
      (address < slice_.base() && address + bytes > slice_.base())) {
    return nullptr;
  }
  std::lock_guard lock(foreign_mutex_);
  // A range overlapping one mapped here already (another client's, or a hostile client naming
  // it) must not be mapped over.
  auto next = foreign_.lower_bound(address);
  if (next != foreign_.end() && next->first < address + bytes) return nullptr;
  if (next != foreign_.begin() && std::prev(next)->first + std::prev(next)->second > address) {
    return nullptr;
  }
  void* want = reinterpret_cast<void*>(address);
  void* at = ::mmap(want, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (at != want) return nullptr;
  foreign_.emplace(address, bytes);
  return at;
}

void PinnedWindow::unmap(void* address, std::uint64_t bytes) {
  const auto start = reinterpret_cast<std::uint64_t>(address);
  if (!proto::return_to_reservation(address, bytes)) {
    // Leave the range out of the allocator: it is no longer known to be reserved.
    log_warn("pinned window: {} bytes at {} could not be returned to the reservation", bytes,
             address);
    return;
  }
  if (slice_.holds(start)) {
    slice_.give(start, bytes);
    return;
  }
  std::lock_guard lock(foreign_mutex_);
  foreign_.erase(start);
}

}  // namespace mpsshim::server

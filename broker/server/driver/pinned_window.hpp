// The server's share of the pinned window (proto/address_arenas.hpp): its GPU's slice, where
// it maps each client's cuMemHostAlloc memory at an address it picks and tells the client, who
// maps the same memfd there too. Host pointer and device pointer are then one address in both
// processes, as under the real driver's unified addressing, whatever the client hands a kernel.
//
// Shared by every worker; the slice's allocator (AddressArena) has its own mutex, and mmap on a
// range this object gave out is the caller's alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "broker/server/driver/address_arena.hpp"

namespace mpsshim::server {

class PinnedWindow {
 public:
  // Reserves the whole window PROT_NONE in this process (the other slices too, so that nothing
  // of the server lands where another GPU's server places its clients' memory). nullptr with
  // the reason in `why` when it cannot.
  static std::unique_ptr<PinnedWindow> open(unsigned ordinal, std::string* why);

  explicit PinnedWindow(unsigned ordinal);
  PinnedWindow(const PinnedWindow&) = delete;
  PinnedWindow& operator=(const PinnedWindow&) = delete;

  // Maps `bytes` (a multiple of the page size) of `fd` read-write at a free address of the
  // slice; nullptr when the slice is full or the mapping failed.
  void* map(int fd, std::uint64_t bytes);
  // Maps `bytes` of `fd` at `address`, a range another GPU's server placed in its own slice:
  // a client's pinned memory used on this GPU too (copies on this GPU's streams, kernels here
  // handed its host pointer). nullptr when the range is not wholly in another slice, overlaps
  // one mapped here already, or the mapping failed.
  void* map_foreign(int fd, std::uint64_t address, std::uint64_t bytes);
  // A mapping map() or map_foreign() made, back to reservation.
  void unmap(void* address, std::uint64_t bytes);
  bool holds(const void* address) const {
    return slice_.holds(reinterpret_cast<std::uint64_t>(address));
  }

 private:
  AddressArena slice_;
  std::mutex foreign_mutex_;
  std::map<std::uint64_t, std::uint64_t> foreign_;  // other slices' ranges mapped here
};

}  // namespace mpsshim::server

// The server's share of the one device address space (proto/address_arenas.hpp): its GPU's
// arena, and which ranges of it are in use. Every device address the server hands out comes
// from here: cuMemAlloc's memory (device_heap.hpp) and clients' VMM reservations (ops/vmm.cpp).
//
// Shared by every worker (a range may be given back by another session's worker, as when the
// last opener of an IPC allocation frees it); one mutex, held only to find, take or give a
// range, never across a driver call.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace mpsshim::server {

class AddressArena {
 public:
  AddressArena(std::uint64_t base, std::uint64_t bytes);
  AddressArena(const AddressArena&) = delete;
  AddressArena& operator=(const AddressArena&) = delete;

  std::uint64_t base() const { return base_; }
  std::uint64_t bytes() const { return bytes_; }
  bool holds(std::uint64_t address) const { return address - base_ < bytes_; }

  // `bytes` at an address that is a multiple of `alignment` (a power of two), first fit; nullopt
  // when no free range is long enough.
  std::optional<std::uint64_t> take(std::uint64_t bytes, std::uint64_t alignment);
  // Exactly [address, address + bytes), when all of it is free.
  bool take_at(std::uint64_t address, std::uint64_t bytes);
  // A range take() or take_at() gave, whole.
  void give(std::uint64_t address, std::uint64_t bytes);

  std::uint64_t taken_bytes() const;

 private:
  const std::uint64_t base_;
  const std::uint64_t bytes_;
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::uint64_t> free_;  // address -> length; neighbours coalesced
  std::uint64_t taken_ = 0;
};

}  // namespace mpsshim::server

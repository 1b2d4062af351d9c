// Page-locked host memory kept ready for parking (mpsshim-server --park-pool SIZE,
// docs/suspend.md).
//
// What a suspend waits for is not the copy (55 GB/s on an H200) but getting page-locked memory to
// copy into (parked_memory.hpp: 4.7–30.7 GB/s, slowest the first time after a machine starts).
// With a pool, that is done once, in the background: when the server retains its primary context
// for a client, a thread of the pool maps SIZE, faults it in and registers it; a suspend then
// takes its blocks' host memory from the pool and copies at once, and a resume or a freed parked
// block gives it back. Blocks the pool has no room for get fresh memory as without it.
//
// The memory is the server's for as long as it holds the primary context (a registration belongs
// to the context it was made in), whether or not anyone is suspended: that is the option's cost.
//
// fill and drain: the coordinator (ContextLease). take, give, holds: any worker; one mutex, held
// only for the books.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "broker/server/driver/address_arena.hpp"
#include "broker/server/driver/driver_table.hpp"

namespace mpsshim::server {

class ParkPool {
 public:
  ParkPool(const DriverTable& cu, std::uint64_t capacity) : cu_(cu), capacity_(capacity) {}
  ~ParkPool() { drain(); }
  ParkPool(const ParkPool&) = delete;
  ParkPool& operator=(const ParkPool&) = delete;

  std::uint64_t capacity() const { return capacity_; }

  // After the primary context `context` was retained: prepares the memory on a thread of the
  // pool's, unless it is ready or on its way. Skipped, with a warning, when the host cannot
  // hold it (host_can_hold).
  void fill(CUcontext context);
  // Before the primary context is released, when nothing is parked: waits for a fill under way,
  // then gives the memory back.
  void drain();

  // `bytes` of the pool (2 MiB-aligned), or null when it is not ready or has no range that long.
  void* take(std::uint64_t bytes);
  // A range take() gave.
  void give(void* host, std::uint64_t bytes);
  bool holds(const void* host) const;
  // What take() could give now in all (0 while not ready).
  std::uint64_t available() const;

 private:
  void prepare(CUcontext context);

  const DriverTable& cu_;
  const std::uint64_t capacity_;
  std::thread filler_;    // the coordinator's
  bool refused_ = false;  // the coordinator's: the host had no room at the last fill
  mutable std::mutex mutex_;
  std::byte* base_ = nullptr;             // under mutex_: set once the memory is ready
  std::unique_ptr<AddressArena> ranges_;  // under mutex_: which of it is taken
};

}  // namespace mpsshim::server

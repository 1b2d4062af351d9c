// The device this server owns: the driver table, the primary context (held while clients need
// it: context_lease.hpp) and the snapshot every client gets at connect.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>

#include <tl/expected.hpp>

#include "broker/server/driver/device_heap.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/driver/driver_table.hpp"
#include "broker/server/driver/pinned_window.hpp"
#include "proto/device_snapshot.hpp"

namespace mpsshim::server {

struct Gpu {
  const DriverTable* cu = nullptr;
  int ordinal = 0;
  int device_count = 0;
  CUdevice device = 0;
  CUcontext primary = nullptr;  // null while released (context_lease.hpp)
  // Counts retains: a re-created primary context may come back under the same handle, and
  // every thread must make it current again all the same.
  std::uint64_t primary_generation = 1;
  CUdevResource sm_resource{};  // the whole device's SMs, the input of every split
  proto::DeviceSnapshot snapshot{};
  // cuMemAlloc's memory and VMM reservations in this GPU's arena (device_heap.hpp); null when
  // the driver could not reserve it, and then the driver places them (addresses may then
  // collide with another GPU's server: logged at start).
  std::shared_ptr<DeviceHeap> heap;
  // Clients' cuMemHostAlloc memory, at addresses the client maps too (pinned_window.hpp); null
  // when this process could not reserve the window, and then it is mapped wherever it fits.
  std::shared_ptr<PinnedWindow> pinned;
};

// cuInit, cuDeviceGet, retain the primary context and make it current on this thread, take
// the snapshot, then reserve the GPU's arena.
tl::expected<Gpu, StartError> open_gpu(const DriverTable& cu, int ordinal);

}  // namespace mpsshim::server

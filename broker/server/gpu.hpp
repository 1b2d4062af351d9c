// The device this server owns: the driver table, the primary context (current on the server
// thread for the life of the process) and the snapshot every client gets at connect.
#pragma once

#include <cuda.h>

#include <tl/expected.hpp>

#include "broker/server/driver.hpp"
#include "broker/server/driver_table.hpp"
#include "proto/device_snapshot.hpp"

namespace mpsshim::server {

struct Gpu {
  const DriverTable* cu = nullptr;
  int ordinal = 0;
  int device_count = 0;
  CUdevice device = 0;
  CUcontext primary = nullptr;
  CUdevResource sm_resource{};  // the whole device's SMs, the input of every split
  proto::DeviceSnapshot snapshot{};
};

// cuInit, cuDeviceGet, retain the primary context and make it current on this thread, then
// take the snapshot.
tl::expected<Gpu, StartError> open_gpu(const DriverTable& cu, int ordinal);

// Releases the primary context (orderly exit only; after a fault the process just exits).
void close_gpu(Gpu& gpu);

}  // namespace mpsshim::server

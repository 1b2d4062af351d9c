// What the shim's core (connection, contexts, devices) tells the rest of the shim: the private
// tables of darkapi/, cuGetProcAddress in entry/. All calls are cheap, lock-free or nearly,
// never block on the broker, and are safe before cuInit (they then report "no devices", "no
// context").
#pragma once

#include <cuda.h>

#include <cstdint>

#include "proto/device_snapshot.hpp"

namespace mpsshim::shim {

// The driver version the shim reports: the server's real driver version once connected, else
// the version of the driver the shim's tables were generated from (13000). Never newer than the
// generated cuGetProcAddress table.
int advertised_driver_version() noexcept;

// Devices visible to this client (after CUDA_VISIBLE_DEVICES), known after a successful cuInit.
int visible_device_count() noexcept;
const proto::DeviceSnapshot* device_snapshot(int ordinal) noexcept;

// The calling thread's current context (nullptr if none).
CUcontext current_context() noexcept;
// Device ordinal and unique id (cuCtxGetId) of a live context; false if ctx is not one.
bool context_identity(CUcontext ctx, int* ordinal, std::uint64_t* id) noexcept;
// The primary context's handle of `device`, stable for the process, without retaining it.
CUresult primary_context_handle(CUdevice device, CUcontext* out) noexcept;

// Implemented by darkapi/ (context-local storage): runs and clears the destructors registered
// for ctx. The core calls it from cuCtxDestroy, primary release-to-zero and primary reset,
// before the context's handle may be reused.
void run_context_local_destructors(CUcontext ctx) noexcept;

}  // namespace mpsshim::shim

// The text of `server_list` and `device_query`.
#pragma once

#include <string>

#include "broker/daemon/supervisor.hpp"

namespace mpsshim::daemon {

// GPU  PID  STATE  RESTARTS  DETAILS, one line per GPU.
std::string format_server_list(const Supervisor& supervisor);

// 13000 -> "13.0", as cuDriverGetVersion encodes it.
std::string format_driver_version(int version);

// Per GPU: name, UUID, memory, SMs, driver version, server state.
std::string format_device_query(const Supervisor& supervisor);

// For programs (the Kubernetes device plugin): one line per GPU of blank-separated key=value
// fields, the device name last and taking the rest of the line:
// `gpu=0 state=running restarts=0 uuid=GPU-… memory=85520809984 sms=132 name=NVIDIA H100 …`
// (uuid, memory, sms and name are `-` before the GPU's server first reported).
std::string format_gpu_states(const Supervisor& supervisor);

}  // namespace mpsshim::daemon

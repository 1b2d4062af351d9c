// The text of `server_list`, `device_query` and `gpu_states`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "broker/daemon/supervisor.hpp"

namespace mpsshim::daemon {

// GPU  PID  STATE  RESTARTS  DETAILS, one line per GPU.
std::string format_server_list(const Supervisor& supervisor);

// The same as JSON arrays (`--json`): [{"gpu": 0, "pid": 1234, "state": "running", "restarts":
// 0, "details": "..."}] and [{"gpu": 0, "name": ..., "uuid": ..., "memory_bytes": ..., "sms": ...,
// "driver_version": 13000, "server_state": ..., "server_pid": ...}] (null before the snapshot).
nlohmann::json server_list_json(const Supervisor& supervisor);
nlohmann::json device_query_json(const Supervisor& supervisor);

// 13000 -> "13.0", as cuDriverGetVersion encodes it.
std::string format_driver_version(int version);

// Per GPU: name, UUID, memory, SMs, driver version, server state.
std::string format_device_query(const Supervisor& supervisor);

// For programs (the Kubernetes device plugin): one line per GPU of blank-separated key=value
// fields, the device name last and taking the rest of the line:
// `gpu=0 state=running restarts=0 uuid=GPU-… memory=85520809984 sms=132 name=NVIDIA H100 …`
// (uuid, memory, sms and name are `-` before the GPU's server first reported).
std::string format_gpu_states(const Supervisor& supervisor);
// The same as a JSON array (`gpu_states --json`): [{"gpu": 0, "state": "running", "restarts": 0,
// "uuid": "GPU-…", "memory_bytes": …, "sms": 132, "name": "…"}] (null before the snapshot).
nlohmann::json gpu_states_json(const Supervisor& supervisor);

}  // namespace mpsshim::daemon

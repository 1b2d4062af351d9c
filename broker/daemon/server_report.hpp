// The text of `server_list` and `device_query`.
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

}  // namespace mpsshim::daemon

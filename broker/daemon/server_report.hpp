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

}  // namespace mpsshim::daemon

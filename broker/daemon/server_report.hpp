// The text of `server_list` and `device_query`.
#pragma once

#include <string>

#include "broker/daemon/supervisor.hpp"

namespace mpsshim::daemon {

// GPU  PID  STATE  RESTARTS  DETAILS, one line per GPU.
std::string format_server_list(const Supervisor& supervisor);

// Per GPU: name, UUID, memory, SMs, driver version, server state.
std::string format_device_query(const Supervisor& supervisor);

}  // namespace mpsshim::daemon

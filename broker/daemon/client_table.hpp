// The `ps` table, built from the servers' kServerStats answers.
//
// A server answers kServerStatsQuery with one line per client, fields separated by blanks:
//   <pid> <uid> <sm_count> <memory_used_bytes> <kernels_launched> <state> <program...>
// (the program name is the rest of the line). A line that does not read so is shown as it is.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mpsshim::daemon {

struct ServerClients {
  int gpu;
  std::string text;  // the server's kServerStats text
};

// PID  USER  GPU  SMS  MEMORY  LAUNCHES  STATE  PROGRAM, then the lines that did not parse.
std::string format_client_table(const std::vector<ServerClients>& servers);

}  // namespace mpsshim::daemon

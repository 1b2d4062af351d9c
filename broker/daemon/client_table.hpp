// The `ps` table, built from the servers' kServerStats answers.
//
// A server answers kServerStatsQuery with one line per client of blank-separated key=value
// fields, values without blanks:
//   client=3 pid=4123 uid=1000 program=python3 sms=32 mem_used=1048576 mem_limit=0
//   launches=1234 state=active
// Unknown keys are ignored and missing ones shown as "-"; a line without pid= (a note such as
// "truncated: ...") is shown as it is.
#pragma once

#include <string>
#include <vector>

namespace mpsshim::daemon {

struct ServerClients {
  int gpu;
  std::string text;  // the server's kServerStats text
};

// PID USER GPU SMS MEMORY LIMIT LAUNCHES STATE PROGRAM, then the lines that are not clients.
std::string format_client_table(const std::vector<ServerClients>& servers);

}  // namespace mpsshim::daemon

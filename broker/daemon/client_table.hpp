// The `ps` table, built from the servers' kServerStats answers.
//
// A server answers kServerStatsQuery with one line per client of blank-separated key=value
// fields, values without blanks:
//   client=3 pid=4123 uid=1000 program=python3 sms=32 mem_used=1048576 mem_limit=0
//   launches=1234 state=active
// Unknown keys are ignored and missing ones shown as "-"; a line without pid= (a note such as
// "truncated: ...") is shown as it is.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mpsshim::daemon {

struct ServerClients {
  int gpu;
  std::string text;  // the server's kServerStats text
};

// PID USER GPU SMS MEMORY LIMIT LAUNCHES STATE PROGRAM, then the lines that are not clients.
// `allocation_name` turns a line's `allocation=` id into what the ALLOCATION column shows
// ("7 ns/pod"); ids 0 and lines without the key show "-".
std::string format_client_table(
    const std::vector<ServerClients>& servers,
    const std::function<std::string(const std::string&)>& allocation_name = {});

// `mpsshimctl stats`: the servers' answers to the query text "stats", one line per client:
//   client=3 pid=4123 uid=1000 program=python3 records=20512 server_us=55123
//   delay_samples=20512 delay_p50_us=0.4 delay_p99_us=3.1 delay_max_us=8.2
//   top=LaunchKernel:20000:51234,CopyHtoD:12:3100
// (broker/server/session_stats.hpp). As a table: PID USER GPU RECORDS SERVER DELAY_P50
// DELAY_P99 DELAY_MAX PROGRAM TOP, durations for people (0.4us, 51.2ms, 1.25s), then the lines
// that are not clients.
std::string format_stats_table(const std::vector<ServerClients>& servers);
// The same as one JSON object: {"clients": [{"gpu": 0, "pid": 4123, ..., "top": [{"op":
// "LaunchKernel", "count": 20000, "server_us": 51234}, ...]}, ...], "notes": ["...", ...]}.
// Times in microseconds; a figure the server did not give is null. `notes` adds lines to "notes".
std::string format_stats_json(const std::vector<ServerClients>& servers, const std::string& notes);

// One client line's key=value fields, as the tables above read them.
using ClientFields = std::map<std::string, std::string, std::less<>>;
// Calls `client(gpu, fields)` for every client line (a line with pid=) of the servers' answers.
void for_each_client(const std::vector<ServerClients>& servers,
                     const std::function<void(int gpu, const ClientFields& fields)>& client);
// The user name of a uid given as text (the uid itself when it has no name).
std::string user_name_of(const std::string& uid_text);

}  // namespace mpsshim::daemon

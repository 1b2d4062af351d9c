// The `ps` table, built from the servers' kServerStats answers.
//
// A server answers kServerStatsQuery with one line per client of blank-separated key=value
// fields, values without blanks (broker/server/accounting/client_usage.hpp):
//   client=3 pid=4123 uid=1000 program=python3 sms=32 sm_percentage=25 mem_used=1048576
//   mem_peak=2097152 mem_limit=0 pinned=0 launches=1234 busy_us=51234 h2d_bytes=4096
//   d2h_bytes=4096 d2d_bytes=0 priority=0 state=active start_time=1732182049.123 allocation=7
//   worker=0
// (the daemon appends namespace= and pod= of a registered allocation, with_pod_fields, and
// isolation_group= of a client of an isolation group's server, with_isolation_group).
// Unknown keys are ignored and missing ones shown as "-"; a line without pid= (a note such as
// "truncated: ...") is shown as it is.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpsshim::daemon {

struct ServerClients {
  int gpu;
  std::string text;  // the server's kServerStats text
};

// `text` of an isolation group's server with isolation_group=`group` on each client line;
// `text` itself for a shared server (group "").
std::string with_isolation_group(const std::string& text, const std::string& group);

// PID USER GPU SMS MEMORY PEAK LIMIT PINNED LAUNCHES BUSY H2D D2H D2D PRIO STATE STARTED
// PROGRAM ALLOCATION ISOLATION, then the lines that are not clients. `allocation_name` turns a
// line's `allocation=` id into what the ALLOCATION column shows ("7 ns/pod"); ids 0 and lines
// without the key show "-".
std::string format_client_table(
    const std::vector<ServerClients>& servers,
    const std::function<std::string(const std::string&)>& allocation_name = {});
// The same as one JSON object: {"clients": [{"gpu": 0, "client": 3, "pid": 4123, "uid": 1000,
// "user": "alice", "program": "python3", "sms": 32, ..., "copied_bytes": {"h2d": 4096, "d2h":
// 4096, "d2d": 0}, ..., "allocation": 7, "namespace": "ns", "pod": "pod"}], "notes": [...]}
// (docs/daemon.md). A figure the server did not give is null; so are allocation, namespace and
// pod of a client outside any allocation (namespace= and pod= come from with_pod_fields). `notes`
// adds lines to "notes".
nlohmann::json client_table_json(const std::vector<ServerClients>& servers,
                                 const std::string& notes);

// `mpsshimctl stats`: the servers' answers to the query text "stats", one line per client:
//   client=3 pid=4123 uid=1000 program=python3 records=20512 server_us=55123
//   delay_samples=20512 delay_p50_us=0.4 delay_p99_us=3.1 delay_max_us=8.2
//   top=LaunchKernel:20000:51234,CopyHtoD:12:3100
// (broker/server/accounting/session_stats.hpp). As a table: PID USER GPU RECORDS SERVER DELAY_P50
// DELAY_P99 DELAY_MAX PROGRAM TOP, durations for people (0.4us, 51.2ms, 1.25s), then the lines
// that are not clients.
std::string format_stats_table(const std::vector<ServerClients>& servers);
// The same as one JSON object: {"clients": [{"gpu": 0, "pid": 4123, ..., "top": [{"op":
// "LaunchKernel", "count": 20000, "server_us": 51234}, ...]}, ...], "notes": ["...", ...]}.
// Times in microseconds; a figure the server did not give is null. `notes` adds lines to "notes".
nlohmann::json stats_json(const std::vector<ServerClients>& servers, const std::string& notes);

// One client line's key=value fields, as the tables above read them.
using ClientFields = std::map<std::string, std::string, std::less<>>;
// Calls `client(gpu, fields)` for every client line (a line with pid=) of the servers' answers.
void for_each_client(const std::vector<ServerClients>& servers,
                     const std::function<void(int gpu, const ClientFields& fields)>& client);
// The user name of a uid given as text (the uid itself when it has no name).
std::string user_name_of(const std::string& uid_text);

}  // namespace mpsshim::daemon

// What a GPU's server holds when no client is attached, measured from outside: its pid and
// restart count (mpsshimctl server_list), its open fds (/proc), and the objects and device
// bytes of the test driver inside it (MPSSHIM_TESTDRIVER_STATS_FILE, tests/testdriver/
// stats_file.cpp). A hostile session that leaked anything leaves one of them above baseline.
#pragma once

#include <sys/types.h>

#include <string>

#include "../e2e/harness.hpp"

namespace mpsshim::hostile_test {

struct DriverStats {
  long live_objects = -1;
  long long device_bytes = -1;
  bool operator==(const DriverStats&) const = default;
};

struct Baseline {
  pid_t server_pid = 0;
  int server_fds = -1;
  DriverStats driver;
  // Why no baseline could be taken ("" when it was: no client listed, the figures settled).
  std::string unsettled;
};

// The daemon's environment for a test driver that reports to `stats_path`.
std::map<std::string, std::string> stats_env(const std::string& stats_path);

pid_t server_pid(const e2e::Daemon& daemon);
int server_restarts(const e2e::Daemon& daemon);
DriverStats read_driver_stats(const std::string& stats_path);
// Waits until `ps` lists no client and the figures have settled; `unsettled` says which did not
// within 10 s (a baseline taken then would compare later figures against noise).
Baseline take_baseline(const e2e::Daemon& daemon, const std::string& stats_path);
// Waits (10 s at most) until no client is listed and everything is back to `baseline`; what
// still differs then, or "" when nothing does.
std::string differences_from(const e2e::Daemon& daemon, const std::string& stats_path,
                             const Baseline& baseline);
// A line of the daemon's log (which holds its servers' too) that names `pid` and contains
// `text`, waited for up to 5 s; "" if none.
std::string log_line(const e2e::Daemon& daemon, pid_t pid, const std::string& text);

}  // namespace mpsshim::hostile_test

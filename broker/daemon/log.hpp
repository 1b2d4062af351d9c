// The daemon's log file on top of the one log (common/log.hpp): lines go to stderr (journald
// under systemd) until --log-file opens a file, which SIGHUP reopens after logrotate moved it.
// Its servers write their stderr to the same place (log_fd), so their lines land whole among
// the daemon's.
#pragma once

#include <string>

#include <tl/expected.hpp>

#include "common/log.hpp"

namespace mpsshim::daemon {

// Lines of `program` (mpsshimd, mpsshimctl, the device plugin): time-stamped, tagged with the
// pid. First thing in main.
void configure_daemon_log(std::string program);

tl::expected<void, std::string> open_log_file(const std::string& path);
void reopen_log_file();  // SIGHUP, after logrotate moved the file

}  // namespace mpsshim::daemon

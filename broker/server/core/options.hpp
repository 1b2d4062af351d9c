// mpsshim-server's command line, as the daemon starts it: `--device N --control-fd FD` and any
// setting of option_table.hpp as `--flag VALUE`; `--help` prints them all.
#pragma once

#include <span>
#include <string>

#include <tl/expected.hpp>

#include "broker/server/core/server.hpp"
#include "common/log.hpp"

namespace mpsshim::server {

struct Options {
  int device = -1;
  int control_fd = -1;
  std::string driver = "libcuda.so.1";
  LogLevel log_level = LogLevel::kInfo;
  // Everything else. Without its flag a setting keeps ServerSettings{}'s value, which is the
  // table's default (options_test.cpp holds them equal).
  ServerSettings settings;
  bool help = false;  // --help, alone
};

// argv without the program name. The error names the offending argument.
tl::expected<Options, std::string> parse_options(std::span<const char* const> args);

// The usage line and one line per flag (option_table.hpp).
std::string server_usage();

}  // namespace mpsshim::server

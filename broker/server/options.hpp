// mpsshim-server's command line, as the daemon starts it:
//   mpsshim-server --device N --control-fd FD [--driver PATH] [--log-level LEVEL]
//                  [--default-sm-percentage P] [--default-memory-limit BYTES] [--workers N]
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tl/expected.hpp>

#include "broker/server/log.hpp"

namespace mpsshim::server {

struct Options {
  int device = -1;
  int control_fd = -1;
  std::string driver = "libcuda.so.1";
  LogLevel log_level = LogLevel::kInfo;
  int default_sm_percentage = 100;
  std::uint64_t default_memory_limit = 0;  // 0 = no limit
  std::size_t workers = 0;                 // worker threads; 0 = one per available CPU
};

inline constexpr std::size_t kMaxWorkers = 256;

// argv without the program name. The error names the offending argument.
tl::expected<Options, std::string> parse_options(std::span<const char* const> args);

inline constexpr const char* kUsage =
    "usage: mpsshim-server --device N --control-fd FD [--driver PATH] "
    "[--log-level error|warn|info|debug] [--default-sm-percentage P] "
    "[--default-memory-limit BYTES] [--workers N]";

}  // namespace mpsshim::server

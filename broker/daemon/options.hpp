// mpsshimd's command line.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "broker/daemon/config_file.hpp"
#include "broker/daemon/isolation.hpp"
#include "broker/daemon/log.hpp"
#include "broker/daemon/metrics.hpp"
#include "broker/server/core/option_table.hpp"

namespace mpsshim::daemon {

struct DaemonOptions {
  std::optional<std::string> config_path;  // --config; its options are parsed before ours
  std::vector<ClientClass> classes;        // the [[class]] tables of --config
  std::optional<std::string> runtime_dir;
  std::string server_path;  // resolved: --server, else beside mpsshimd, else libexec
  std::optional<std::string> driver_path;
  bool multiuser = false;
  bool require_allocation_token = false;  // token-less clients get the defaults (kubernetes.md)
  LogLevel log_level = LogLevel::kInfo;
  std::optional<std::string> log_file;
  bool daemonize = false;
  int restart_limit = 5;
  std::chrono::milliseconds stop_timeout{10'000};
  std::optional<int> default_sm_percentage;
  std::optional<std::uint64_t> default_memory_limit;
  // Settings passed on to every GPU's server (broker/server/core/option_table.hpp), each given
  // by the mpsshimd option of its name: checked here, so that a typo stops mpsshimd at once
  // instead of every server at its start; unset ones keep the server's default.
  server::PassedSettings server_settings;
  std::optional<MetricsAddress> metrics_listen;  // --metrics-listen; unset: no metrics endpoint
  IsolationRule isolation = IsolationRule::kShared;  // --isolation
  std::chrono::seconds isolation_idle_timeout{60};   // --isolation-idle-timeout
  int isolation_max_servers = 16;                    // --isolation-max-servers
  std::string nvidia_mps_pipe_directory;             // --nvidia-mps-pipe-directory
  std::chrono::seconds isolate_after_fault{0};       // --isolate-after-fault (0: off)
  bool help = false;
  bool version = false;
};

tl::expected<DaemonOptions, std::string> parse_daemon_options(int argc, char** argv);
std::string daemon_usage();

}  // namespace mpsshim::daemon

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
  std::optional<int> server_workers;  // --workers of every server; unset: the server decides
  // --launch-batch of every server (--server-launch-batch N; --launch-batching off: 0); unset:
  // the server's default.
  std::optional<int> server_launch_batch;
  std::optional<int> server_launch_batch_min;             // --launch-batch-min of every server
  std::optional<int> server_launch_batch_ramp;            // --launch-batch-ramp (off: 0); unset: on
  std::optional<std::string> server_launch_batch_graphs;  // --launch-batch-graphs; unset: padded
  bool server_busy_time = false;   // --busy-time on: every server measures it
  bool server_host_fences = true;  // --host-fences off: passed on to every server
  std::optional<int>
      server_crowded_fence_max_queued;  // --crowded-fence-max-queued; unset: the server's
  bool server_share_images = true;      // --share-images off: passed on to every server
  std::optional<int> server_image_idle_timeout_s;    // --image-idle-timeout: passed on
  std::optional<int> server_event_poll_us;           // --event-poll-us
  std::optional<int> server_spin_clients;            // --spin-clients
  bool server_priority_scheduling = true;            // --priority-scheduling (priority_gate.hpp)
  std::optional<int> server_priority_max_hold_us;    // --priority-max-hold-us
  std::optional<int> server_priority_fence_poll_us;  // --priority-fence-poll-us
  // --priority-reserve-sms, checked and passed on as written; unset: the servers' default.
  std::optional<std::string> server_priority_reserve_sms;
  std::optional<int> context_idle_timeout_s;     // passed on to every server; unset: its default
  std::optional<MetricsAddress> metrics_listen;  // --metrics-listen; unset: no metrics endpoint
  // --client-limit NAME=VALUE (repeatable), checked and passed on to every server as NAME=N
  // (broker/server/accounting/client_limits.hpp); a later one for the same NAME wins there.
  std::vector<std::string> client_limits;
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

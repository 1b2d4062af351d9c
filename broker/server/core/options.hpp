// mpsshim-server's command line, as the daemon starts it:
//   mpsshim-server --device N --control-fd FD [--driver PATH] [--log-level LEVEL]
//                  [--default-sm-percentage P] [--default-memory-limit BYTES] [--workers N]
//                  [--launch-batch N] [--launch-batch-min N] [--launch-batch-ramp N|on|off]
//                  [--launch-batch-graphs padded|runs|exact]
//                  [--host-fences on|off] [--crowded-fence-max-queued N] [--share-images on|off]
//                  [--context-idle-timeout SECS] [--priority-scheduling on|off]
//                  [--priority-max-hold-us N] [--priority-fence-poll-us N] [--priority-run-ahead N]
//                  [--priority-reserve-sms N|P%]
//                  [--client-limit NAME=N]...
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tl/expected.hpp>

#include "broker/server/accounting/client_limits.hpp"
#include "broker/server/base/log.hpp"
#include "broker/server/driver/host_fences.hpp"
#include "broker/server/images/image_cache.hpp"
#include "broker/server/launch/launch_batch.hpp"
#include "broker/server/scheduling/priority_gate.hpp"

namespace mpsshim::server {

inline constexpr int kDefaultContextIdleTimeoutS = 10;

struct Options {
  int device = -1;
  int control_fd = -1;
  std::string driver = "libcuda.so.1";
  LogLevel log_level = LogLevel::kInfo;
  int default_sm_percentage = 100;
  std::uint64_t default_memory_limit = 0;  // 0 = no limit
  std::size_t workers = 0;                 // worker threads; 0 = one per available CPU
  // Seconds without a client before the primary context (~500 MiB of GPU memory) is released;
  // -1 = never. See context_lease.hpp.
  int context_idle_timeout_s = kDefaultContextIdleTimeoutS;
  // Most kernel launches issued as one graph launch (launch_batch.hpp); 0 or 1: off.
  std::size_t launch_batch = LaunchBatchSettings{}.max_launches;
  // Fewest launches that go out as a graph launch; shorter runs go out eagerly.
  std::size_t launch_batch_min = LaunchBatchSettings{}.min_launches;
  // --launch-batch-ramp N: the largest batch of the ramp after an idle stream; off: 0, no ramp
  // (LaunchBatchSettings::ramp_last).
  std::size_t launch_batch_ramp = LaunchBatchSettings{}.ramp_last;
  // --launch-batch-graphs padded|runs|exact: how a batch goes out (LaunchBatchSettings::graphs).
  LaunchBatchSettings::Graphs launch_batch_graphs = LaunchBatchSettings{}.graphs;
  bool busy_time = false;   // --busy-time on: GPU busy time per client (busy_time.hpp)
  bool host_fences = true;  // --host-fences off: completions poll events (host_fences.hpp)
  // --crowded-fence-max-queued N: while crowded, a synchronize behind at most N operations gets
  // a host fence (ServerSettings::crowded_fence_max_queued).
  std::uint64_t crowded_fence_max_queued = kCrowdedFenceMaxQueued;
  bool share_images =
      true;  // --share-images off: every library loaded per session (image_cache.hpp)
  // --image-idle-timeout SECS: how long a shared library no client holds stays loaded.
  int image_idle_timeout_s = static_cast<int>(kDefaultImageIdleTimeout.count());
  long event_poll_us = kDefaultEventPoll.count();  // --event-poll-us N (0: every pass)
  // --spin-clients N: clients whose waiting threads may spin (ServerSettings::spin_clients);
  // -1: half the CPUs the server may run on.
  long spin_clients = -1;
  // Below-normal clients held back while normal ones have work in flight (priority_gate.hpp).
  bool priority_scheduling = PrioritySettings{}.enabled;
  long priority_max_hold_us = PrioritySettings{}.max_hold.count();
  std::size_t priority_run_ahead = PrioritySettings{}.run_ahead;
  long priority_fence_poll_us = PrioritySettings{}.fence_poll.count();
  // SMs kept for normal-priority clients (priority_reserve.hpp); only with priority scheduling.
  SmReserveSpec priority_reserve_sms = PrioritySettings{}.reserve;
  ClientLimits client_limits;  // --client-limit NAME=N, repeatable (client_limits.hpp)
};

inline constexpr std::size_t kMaxWorkers = 256;
inline constexpr std::size_t kMaxLaunchBatch = 256;
inline constexpr std::uint64_t kMaxCrowdedFenceQueued = 1u << 20;

// argv without the program name. The error names the offending argument.
tl::expected<Options, std::string> parse_options(std::span<const char* const> args);

inline constexpr const char* kUsage =
    "usage: mpsshim-server --device N --control-fd FD [--driver PATH] "
    "[--log-level error|warn|info|debug] [--default-sm-percentage P] [--launch-batch N] "
    "[--launch-batch-min N] [--launch-batch-ramp N|on|off] "
    "[--launch-batch-graphs padded|runs|exact] [--busy-time on|off] "
    "[--host-fences on|off] [--crowded-fence-max-queued N] [--share-images on|off] "
    "[--image-idle-timeout SECS] "
    "[--event-poll-us N] "
    "[--spin-clients N] "
    "[--default-memory-limit BYTES] [--workers N] "
    "[--context-idle-timeout SECS] [--priority-scheduling on|off] [--priority-max-hold-us N] "
    "[--priority-fence-poll-us N] [--priority-run-ahead N] [--priority-reserve-sms N|P%] "
    "[--client-limit NAME=N]...";

}  // namespace mpsshim::server

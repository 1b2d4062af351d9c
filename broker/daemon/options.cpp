#include "broker/daemon/options.hpp"

#include <fmt/format.h>
#include <getopt.h>
#include <unistd.h>

#include <charconv>
#include <climits>
#include <string_view>

#include "broker/daemon/sizes.hpp"
#include "broker/server/accounting/client_limits.hpp"
#include "broker/server/scheduling/sm_reserve_option.hpp"

#ifndef MPSSHIM_LIBEXECDIR
#error "meson defines MPSSHIM_LIBEXECDIR (the installed server's directory)"
#endif
#ifndef MPSSHIM_SERVER_FROM_BINDIR
#error "meson defines MPSSHIM_SERVER_FROM_BINDIR (the installed server relative to bindir)"
#endif

namespace mpsshim::daemon {

namespace {

enum LongOnly : int {
  kRuntimeDir = 256,
  kServer,
  kDriver,
  kMultiuser,
  kLogLevel,
  kLogFile,
  kRestartLimit,
  kStopTimeout,
  kDefaultSm,
  kDefaultMemory,
  kServerWorkers,
  kServerLaunchBatch,
  kLaunchBatching,
  kServerLaunchBatchMin,
  kBusyTime,
  kHostFences,
  kCrowdedFenceMaxQueued,
  kShareImages,
  kImageIdleTimeout,
  kLaunchBatchRamp,
  kLaunchBatchGraphs,
  kEventPoll,
  kSpinClients,
  kPriorityScheduling,
  kPriorityMaxHold,
  kPriorityFencePoll,
  kPriorityReserveSms,
  kContextIdleTimeout,
  kMetricsListen,
  kRequireAllocationToken,
  kClientLimit,
  kIsolation,
  kConfig,
  kIsolationIdleTimeout,
  kNvidiaMpsPipeDirectory,
  kIsolateAfterFault,
  kIsolationMaxServers,
  kVersion,
};

// mpsshim-server beside this executable, or where the build tree puts it (broker/daemon/ ->
// broker/server/), or where the install puts it relative to bindir (bin/ ->
// ../libexec/mpsshim/: an install or package moved or extracted anywhere), else the one
// installed under libexec.
std::string default_server_path() {
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<std::size_t>(n));
    dir.erase(dir.rfind('/') + 1);
    for (const char* relative :
         {"mpsshim-server", "../server/mpsshim-server", MPSSHIM_SERVER_FROM_BINDIR}) {
      if (*relative == '\0') continue;  // bindir or libexecdir outside the prefix
      std::string candidate = dir + relative;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return std::string(MPSSHIM_LIBEXECDIR) + "/mpsshim-server";
}

template <typename T>
tl::expected<T, std::string> number(std::string_view option, std::string_view text, T low, T high) {
  T value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || value < low || value > high) {
    return tl::unexpected(
        fmt::format("{} takes a whole number from {} to {}, not `{}`", option, low, high, text));
  }
  return value;
}

// "pinned=4G" -> "pinned=4294967296": checked here, so a typo stops mpsshimd at once instead
// of every server at its start.
tl::expected<std::string, std::string> client_limit_argument(std::string_view text) {
  const std::size_t equals = text.find('=');
  const std::string_view name = text.substr(0, equals);
  auto limit = equals == std::string_view::npos ? std::nullopt : server::find_client_limit(name);
  if (!limit) {
    return tl::unexpected(fmt::format("--client-limit takes NAME=VALUE, NAME one of {}; not `{}`",
                                      server::client_limit_names(), text));
  }
  const std::string_view value = text.substr(equals + 1);
  const bool bytes = server::spec_of(*limit).bytes;
  std::optional<std::uint64_t> number = parse_size(value);
  if (!bytes && number) {
    std::uint64_t plain = 0;
    auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), plain);
    if (error != std::errc{} || end != value.data() + value.size()) number.reset();
  }
  if (!number) {
    return tl::unexpected(fmt::format("--client-limit {}: expected {} (0: no limit)", text,
                                      bytes ? "a size such as 4G or 512M" : "a whole number"));
  }
  return fmt::format("{}={}", name, *number);
}

}  // namespace

std::string daemon_usage() {
  return R"(usage: mpsshimd [options]

The mpsshim control daemon: starts one mpsshim-server per GPU, restarts those that die, hands
each client connection to its GPU's server and answers mpsshimctl. It never loads CUDA.

  --config FILE        options and client classes from a TOML file (docs/config.md); options
                       given here win over the file's. SIGHUP or `mpsshimctl reload` reads it
                       again
  --runtime-dir DIR    control socket and pid file directory (default: $CUDA_MPS_PIPE_DIRECTORY,
                       else /run/mpsshim for root, else /tmp/mpsshim-$UID)
  --multiuser          serve clients of every uid (root only; default: the daemon's uid only)
  --server PATH        the per-GPU server (default: mpsshim-server beside mpsshimd or in the
                       build tree's broker/server/, else the installed one)
  --driver PATH        CUDA driver library the servers load (passed to every server)
  --log-level LEVEL    error, warn, info (default) or debug; also passed to the servers
  --log-file PATH      log here instead of stderr (SIGHUP reopens it)
  -d, --daemon         run in the background; returns once every GPU's server is up
  --restart-limit N    give up on a GPU after N failed server starts in a row (default 5)
  --stop-timeout SECS  on shutdown, SIGKILL servers still running after SECS (default 10)
  --default-sm-percentage P    default active thread percentage of new clients (1-100)
  --default-memory-limit SIZE  default device memory limit of new clients on every GPU (e.g. 4G)
  --server-workers N   worker threads of every GPU's server (default: one per CPU the server
                       may run on; see mpsshim-server --workers)
  --launch-batching on|off  whether every GPU's server issues a client's waiting kernel
                       launches as graph launches (default on; see docs/launch-batching.md)
  --server-launch-batch N  most kernel launches of a client every GPU's server issues as one
                       graph launch (default 64; 0 = off, as --launch-batching off)
  --server-launch-batch-min N  fewest waiting launches that go out as one graph launch;
                       fewer go out one by one (default 8)
  --launch-batch-ramp N|on|off  a client's first launch after it synchronized goes out at
                       once, its next batches grow from the minimum up to N launches (default
                       on: 8; off: no ramp; not while the server is crowded; see
                       docs/launch-batching.md)
  --launch-batch-graphs padded|runs|exact  how a batch goes out: padded (default) one graph
                       launch of the next power-of-two length, its extra nodes disabled; runs:
                       power-of-two runs, the last few launches one by one; exact: a graph of
                       the batch's own length (docs/launch-batching.md)
  --busy-time on|off   whether every GPU's server measures each client's GPU busy time with
                       timing events (default off: it costs the launch path; docs/daemon.md)
  --host-fences on|off  whether every GPU's server learns that a client's work finished from a
                       word the GPU writes into host memory, instead of polling events (default
                       on; see docs/daemon.md)
  --crowded-fence-max-queued N  while a server has more clients than it lets spin, a
                       synchronize gets a host fence only behind at most N queued operations
                       (default 8; docs/daemon.md)
  --share-images on|off  whether a GPU's server loads a library image once for every client that
                       sends the same bytes (default on; only images without __device__,
                       __constant__ or __managed__ variables; see docs/daemon.md)
  --image-idle-timeout SECS  a shared library image no client holds stays loaded SECS for
                       the next client that sends it (default 60; 0 = unloaded with the last
                       client; all go with the primary context; see docs/daemon.md)
  --event-poll-us N    how often a server asks the driver whether the work a synchronize waits
                       for finished, where no host fence tells it, in microseconds (default 0:
                       on every pass of the client's worker; docs/daemon.md)
  --spin-clients N     with more clients than N on a GPU, its server tells them to sleep while
                       they wait for an answer instead of spinning (default: half the CPUs; 0:
                       always sleep; docs/daemon.md)
  --priority-scheduling on|off  while a client of normal priority has GPU work in flight,
                       hold back clients with CUDA_MPS_CLIENT_PRIORITY=1 (default on; see
                       docs/daemon.md)
  --priority-max-hold-us N  the longest a below-normal client is held back at once (default
                       2000)
  --priority-fence-poll-us N  with --host-fences off or a crowded server: how often it asks
                       the driver whether a client's priority fences completed, in
                       microseconds (default 50; 0: on every pass); host-fence words are
                       read every pass
  --priority-reserve-sms N|P%  SMs (or a percentage of them) kept for normal-priority clients:
                       while one is connected, clients with CUDA_MPS_CLIENT_PRIORITY=1 run
                       without them (default 18%, rounded up to whole groups of the split;
                       0 = off; only with --priority-scheduling on; see docs/daemon.md)
  --context-idle-timeout SECS  a GPU's server releases its primary context (~500 MiB of GPU
                       memory) after SECS without a client and creates it again for the next
                       one (default 10; 0 = as soon as the last client leaves; -1 = never)
  --metrics-listen [ADDR:]PORT  serve Prometheus metrics at http://ADDR:PORT/metrics (off by
                       default; a bare PORT is 127.0.0.1:PORT; [::1]:PORT and 0.0.0.0:PORT
                       work too; port 0 picks a free one, named in the log; see
                       docs/metrics.md)
  --client-limit NAME=VALUE  a per-client cap of every GPU's server (repeatable): streams,
                       events, modules, graphs, memory-pools, allocations, pinned (a size),
                       host-functions, in-flight, ipc-opens; 0 = none. Defaults in docs/daemon.md
  --isolation shared|user|allocation|client  which clients share a server process, and so a
                       CUDA context and GPU address space: all of them (default, as NVIDIA MPS),
                       those of one uid, of one Kubernetes allocation, or none (each client
                       its own); other groups get server processes of their own, isolated from
                       each other's memory and faults (docs/isolation.md)
  --isolation-idle-timeout SECS  an isolation group's server is stopped after SECS without
                       clients (default 60)
  --isolation-max-servers N  isolation-group servers one GPU may run at once (default 16);
                       a client of a group beyond them is refused
  --nvidia-mps-pipe-directory DIR  run every server as a client of the NVIDIA MPS daemon
                       whose pipe directory is DIR: isolation groups then overlap on the GPU,
                       each in its own address space, but a GPU fault ends every group of that
                       GPU (docs/isolation.md)
  --isolate-after-fault SECS  for SECS after a GPU fault, a new client of the uid and program
                       whose work was its likely cause gets an isolation group of its own
                       (default 0: off; docs/isolation.md)
  --require-allocation-token  clients without an allocation token (from the Kubernetes
                       device plugin) get the default SM share and memory limit, whatever they
                       ask for (see docs/kubernetes.md)
  -h, --help           this text
  --version            the version and the ABI it speaks
)";
}

tl::expected<DaemonOptions, std::string> parse_daemon_options(int argc, char** argv) {
  static const option kLong[] = {
      {"runtime-dir", required_argument, nullptr, kRuntimeDir},
      {"server", required_argument, nullptr, kServer},
      {"driver", required_argument, nullptr, kDriver},
      {"multiuser", no_argument, nullptr, kMultiuser},
      {"log-level", required_argument, nullptr, kLogLevel},
      {"log-file", required_argument, nullptr, kLogFile},
      {"daemon", no_argument, nullptr, 'd'},
      {"restart-limit", required_argument, nullptr, kRestartLimit},
      {"stop-timeout", required_argument, nullptr, kStopTimeout},
      {"default-sm-percentage", required_argument, nullptr, kDefaultSm},
      {"default-memory-limit", required_argument, nullptr, kDefaultMemory},
      {"server-workers", required_argument, nullptr, kServerWorkers},
      {"server-launch-batch", required_argument, nullptr, kServerLaunchBatch},
      {"launch-batching", required_argument, nullptr, kLaunchBatching},
      {"server-launch-batch-min", required_argument, nullptr, kServerLaunchBatchMin},
      {"busy-time", required_argument, nullptr, kBusyTime},
      {"host-fences", required_argument, nullptr, kHostFences},
      {"crowded-fence-max-queued", required_argument, nullptr, kCrowdedFenceMaxQueued},
      {"share-images", required_argument, nullptr, kShareImages},
      {"image-idle-timeout", required_argument, nullptr, kImageIdleTimeout},
      {"launch-batch-ramp", required_argument, nullptr, kLaunchBatchRamp},
      {"launch-batch-graphs", required_argument, nullptr, kLaunchBatchGraphs},
      {"event-poll-us", required_argument, nullptr, kEventPoll},
      {"spin-clients", required_argument, nullptr, kSpinClients},
      {"priority-scheduling", required_argument, nullptr, kPriorityScheduling},
      {"priority-max-hold-us", required_argument, nullptr, kPriorityMaxHold},
      {"priority-fence-poll-us", required_argument, nullptr, kPriorityFencePoll},
      {"priority-reserve-sms", required_argument, nullptr, kPriorityReserveSms},
      {"context-idle-timeout", required_argument, nullptr, kContextIdleTimeout},
      {"metrics-listen", required_argument, nullptr, kMetricsListen},
      {"require-allocation-token", no_argument, nullptr, kRequireAllocationToken},
      {"client-limit", required_argument, nullptr, kClientLimit},
      {"isolation", required_argument, nullptr, kIsolation},
      {"config", required_argument, nullptr, kConfig},
      {"isolation-idle-timeout", required_argument, nullptr, kIsolationIdleTimeout},
      {"nvidia-mps-pipe-directory", required_argument, nullptr, kNvidiaMpsPipeDirectory},
      {"isolate-after-fault", required_argument, nullptr, kIsolateAfterFault},
      {"isolation-max-servers", required_argument, nullptr, kIsolationMaxServers},
      {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, kVersion},
      {nullptr, 0, nullptr, 0},
  };
  DaemonOptions options;
  std::optional<std::string> server;
  ::opterr = 0;
  ::optind = 1;
  for (int c; (c = ::getopt_long(argc, argv, ":dh", kLong, nullptr)) != -1;) {
    std::string_view arg = ::optarg != nullptr ? ::optarg : "";
    switch (c) {
      case kRuntimeDir:
        options.runtime_dir = std::string(arg);
        break;
      case kServer:
        server = std::string(arg);
        break;
      case kDriver:
        options.driver_path = std::string(arg);
        break;
      case kMultiuser:
        options.multiuser = true;
        break;
      case kRequireAllocationToken:
        options.require_allocation_token = true;
        break;
      case kLogLevel:
        if (auto level = parse_log_level(arg)) {
          options.log_level = *level;
        } else {
          return tl::unexpected(
              fmt::format("--log-level takes error, warn, info or debug, not `{}`", arg));
        }
        break;
      case kLogFile:
        options.log_file = std::string(arg);
        break;
      case 'd':
        options.daemonize = true;
        break;
      case kRestartLimit: {
        auto n = number<int>("--restart-limit", arg, 1, 1000);
        if (!n) return tl::unexpected(n.error());
        options.restart_limit = *n;
        break;
      }
      case kStopTimeout: {
        auto n = number<int>("--stop-timeout", arg, 0, 3600);
        if (!n) return tl::unexpected(n.error());
        options.stop_timeout = std::chrono::seconds(*n);
        break;
      }
      case kDefaultSm: {
        auto n = number<int>("--default-sm-percentage", arg, 1, 100);
        if (!n) return tl::unexpected(n.error());
        options.default_sm_percentage = *n;
        break;
      }
      case kDefaultMemory: {
        auto bytes = parse_size(arg);
        if (!bytes) {
          return tl::unexpected(
              fmt::format("--default-memory-limit takes a size such as 4G or 512M, not `{}`", arg));
        }
        options.default_memory_limit = *bytes;
        break;
      }
      case kServerWorkers: {
        auto n = number<int>("--server-workers", arg, 1, 256);
        if (!n) return tl::unexpected(n.error());
        options.server_workers = *n;
        break;
      }
      case kServerLaunchBatch: {
        auto n = number<int>("--server-launch-batch", arg, 0, 256);
        if (!n) return tl::unexpected(n.error());
        options.server_launch_batch = *n;
        break;
      }
      case kServerLaunchBatchMin: {
        auto n = number<int>("--server-launch-batch-min", arg, 2, 256);
        if (!n) return tl::unexpected(n.error());
        options.server_launch_batch_min = *n;
        break;
      }
      case kPriorityScheduling: {
        const std::string_view value = arg;
        if (value != "on" && value != "off") {
          return tl::unexpected(fmt::format("--priority-scheduling {}: expected on or off", value));
        }
        options.server_priority_scheduling = value == "on";
        break;
      }
      case kPriorityMaxHold: {
        auto n = number<int>("--priority-max-hold-us", arg, 1, 10'000'000);
        if (!n) return tl::unexpected(n.error());
        options.server_priority_max_hold_us = *n;
        break;
      }
      case kSpinClients: {
        auto n = number<int>("--spin-clients", arg, 0, 1'000'000);
        if (!n) return tl::unexpected(n.error());
        options.server_spin_clients = *n;
        break;
      }
      case kEventPoll: {
        auto n = number<int>("--event-poll-us", arg, 0, 1'000'000);
        if (!n) return tl::unexpected(n.error());
        options.server_event_poll_us = *n;
        break;
      }
      case kPriorityFencePoll: {
        auto n = number<int>("--priority-fence-poll-us", arg, 0, 1'000'000);
        if (!n) return tl::unexpected(n.error());
        options.server_priority_fence_poll_us = *n;
        break;
      }
      case kPriorityReserveSms: {
        auto spec = server::parse_sm_reserve(arg);
        if (!spec) return tl::unexpected(spec.error());
        options.server_priority_reserve_sms = server::format_sm_reserve(*spec);
        break;
      }
      case kBusyTime: {
        const std::string_view value = arg;
        if (value != "on" && value != "off") {
          return tl::unexpected(fmt::format("--busy-time {}: expected on or off", value));
        }
        options.server_busy_time = value == "on";
        break;
      }
      case kLaunchBatchRamp: {
        const std::string_view value = arg;
        if (value == "off") {
          options.server_launch_batch_ramp = 0;
        } else if (value == "on") {
          options.server_launch_batch_ramp.reset();  // the server's default
        } else {
          auto n = number<int>("--launch-batch-ramp", arg, 0, 256);
          if (!n) return tl::unexpected(n.error());
          options.server_launch_batch_ramp = *n;
        }
        break;
      }
      case kLaunchBatchGraphs: {
        const std::string_view value = arg;
        if (value != "padded" && value != "runs" && value != "exact") {
          return tl::unexpected(
              fmt::format("--launch-batch-graphs {}: expected padded, runs or exact", value));
        }
        options.server_launch_batch_graphs = std::string(value);
        break;
      }
      case kCrowdedFenceMaxQueued: {
        auto n = number<int>("--crowded-fence-max-queued", arg, 0, 1 << 20);
        if (!n) return tl::unexpected(n.error());
        options.server_crowded_fence_max_queued = *n;
        break;
      }
      case kHostFences: {
        const std::string_view value = arg;
        if (value != "on" && value != "off") {
          return tl::unexpected(fmt::format("--host-fences {}: expected on or off", value));
        }
        options.server_host_fences = value == "on";
        break;
      }
      case kShareImages: {
        const std::string_view value = arg;
        if (value != "on" && value != "off") {
          return tl::unexpected(fmt::format("--share-images {}: expected on or off", value));
        }
        options.server_share_images = value == "on";
        break;
      }
      case kImageIdleTimeout: {
        auto n = number<int>("--image-idle-timeout", arg, 0, 86400);
        if (!n) return tl::unexpected(n.error());
        options.server_image_idle_timeout_s = *n;
        break;
      }
      case kLaunchBatching: {
        const std::string_view value = arg;
        if (value == "off") {
          options.server_launch_batch = 0;
        } else if (value == "on") {
          // The server's default size, unless --server-launch-batch chose one.
          if (options.server_launch_batch == 0) options.server_launch_batch.reset();
        } else {
          return tl::unexpected(fmt::format("--launch-batching {}: expected on or off", value));
        }
        break;
      }
      case kContextIdleTimeout: {
        auto n = number<int>("--context-idle-timeout", arg, -1, 86400);
        if (!n) return tl::unexpected(n.error());
        options.context_idle_timeout_s = *n;
        break;
      }
      case kMetricsListen: {
        auto address = parse_metrics_address(arg);
        if (!address) return tl::unexpected(address.error());
        options.metrics_listen = std::move(*address);
        break;
      }
      case kClientLimit: {
        auto limit = client_limit_argument(arg);
        if (!limit) return tl::unexpected(limit.error());
        options.client_limits.push_back(std::move(*limit));
        break;
      }
      case kConfig:
        options.config_path = std::string(arg);
        break;
      case kIsolation: {
        auto rule = parse_isolation_rule(arg);
        if (!rule) return tl::unexpected(rule.error());
        options.isolation = *rule;
        break;
      }
      case kIsolationIdleTimeout: {
        auto n = number<int>("--isolation-idle-timeout", arg, 1, 86'400);
        if (!n) return tl::unexpected(n.error());
        options.isolation_idle_timeout = std::chrono::seconds(*n);
        break;
      }
      case kNvidiaMpsPipeDirectory:
        if (arg.empty() || arg.front() != '/') {
          return tl::unexpected(fmt::format(
              "--nvidia-mps-pipe-directory takes an absolute directory, not `{}`", arg));
        }
        options.nvidia_mps_pipe_directory = std::string(arg);
        break;
      case kIsolateAfterFault: {
        auto n = number<int>("--isolate-after-fault", arg, 0, 30 * 86'400);
        if (!n) return tl::unexpected(n.error());
        options.isolate_after_fault = std::chrono::seconds(*n);
        break;
      }
      case kIsolationMaxServers: {
        auto n = number<int>("--isolation-max-servers", arg, 1, 1000);
        if (!n) return tl::unexpected(n.error());
        options.isolation_max_servers = *n;
        break;
      }
      case 'h':
        options.help = true;
        break;
      case kVersion:
        options.version = true;
        break;
      case ':':
        return tl::unexpected(fmt::format("{} needs a value", argv[::optind - 1]));
      default:
        return tl::unexpected(fmt::format("unknown option {}", argv[::optind - 1]));
    }
  }
  if (::optind < argc) {
    return tl::unexpected(fmt::format("unexpected argument `{}`", argv[::optind]));
  }
  options.server_path = server ? *server : default_server_path();
  return options;
}

}  // namespace mpsshim::daemon

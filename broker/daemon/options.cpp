#include "broker/daemon/options.hpp"

#include <fmt/format.h>
#include <getopt.h>
#include <unistd.h>

#include <charconv>
#include <climits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "broker/daemon/sizes.hpp"
#include "broker/server/accounting/client_limits.hpp"

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
  kLaunchBatching,
  kMetricsListen,
  kRequireAllocationToken,
  kIsolation,
  kConfig,
  kIsolationIdleTimeout,
  kNvidiaMpsPipeDirectory,
  kIsolateAfterFault,
  kIsolationMaxServers,
  kVersion,
  // Settings of the servers: kServerSetting + their index in server_options().
  kServerSetting = 512,
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

// The servers' settings an mpsshimd option passes on, in the table's order.
std::span<const server::ServerOption> passed_options() {
  static const std::vector<server::ServerOption> passed = [] {
    std::vector<server::ServerOption> out;
    for (const server::ServerOption& option : server::server_options()) {
      if (option.passed_by == server::PassedBy::kDaemonOption) out.push_back(option);
    }
    return out;
  }();
  return passed;
}

// --NAME VALUE of a server setting: checked against the server's table and kept as the server
// takes it (client-limit sizes in bytes first).
std::optional<std::string> set_server_setting(server::PassedSettings& settings,
                                              const server::ServerOption& option,
                                              std::string_view arg) {
  const std::string as = fmt::format("--{}", server::daemon_flag_of(option));
  std::string value(arg);
  if (option.setting == server::Setting::kClientLimit) {
    auto limit = client_limit_argument(arg);
    if (!limit) return limit.error();
    value = std::move(*limit);
  }
  auto checked = server::check_option_value(option, value, as);
  if (!checked) return checked.error();
  settings.set(option.setting, std::move(*checked));
  return std::nullopt;
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
  --log-level LEVEL    error, warn, info (default), debug or trace; also passed to the
                       servers
  --log-file PATH      log here instead of stderr (SIGHUP reopens it)
  -d, --daemon         run in the background; returns once every GPU's server is up
  --restart-limit N    give up on a GPU after N failed server starts in a row (default 5)
  --stop-timeout SECS  on shutdown, SIGKILL servers still running after SECS (default 10)
  --default-sm-percentage P    default active thread percentage of new clients (1-100)
  --default-memory-limit SIZE  default device memory limit of new clients on every GPU (e.g. 4G)
  --metrics-listen [ADDR:]PORT  serve Prometheus metrics at http://ADDR:PORT/metrics (off by
                       default; a bare PORT is 127.0.0.1:PORT; [::1]:PORT and 0.0.0.0:PORT
                       work too; port 0 picks a free one, named in the log; see
                       docs/metrics.md)
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

Passed on to every GPU's server (mpsshim-server's flags; docs/daemon.md says more):
  --launch-batching on|off  off: --server-launch-batch 0; on: its default size again
)" + server::option_help_lines(passed_options(), true);
}

tl::expected<DaemonOptions, std::string> parse_daemon_options(int argc, char** argv) {
  static const std::vector<option> kLong = [] {
    std::vector<option> out{
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
        {"launch-batching", required_argument, nullptr, kLaunchBatching},
        {"metrics-listen", required_argument, nullptr, kMetricsListen},
        {"require-allocation-token", no_argument, nullptr, kRequireAllocationToken},
        {"isolation", required_argument, nullptr, kIsolation},
        {"config", required_argument, nullptr, kConfig},
        {"isolation-idle-timeout", required_argument, nullptr, kIsolationIdleTimeout},
        {"nvidia-mps-pipe-directory", required_argument, nullptr, kNvidiaMpsPipeDirectory},
        {"isolate-after-fault", required_argument, nullptr, kIsolateAfterFault},
        {"isolation-max-servers", required_argument, nullptr, kIsolationMaxServers},
        {"help", no_argument, nullptr, 'h'},
        {"version", no_argument, nullptr, kVersion},
    };
    const auto table = server::server_options();
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (table[i].passed_by != server::PassedBy::kDaemonOption) continue;
      // getopt_long keeps the pointer: the table's names live as long as the program.
      out.push_back({server::daemon_flag_of(table[i]).data(), required_argument, nullptr,
                     kServerSetting + static_cast<int>(i)});
    }
    out.push_back({nullptr, 0, nullptr, 0});
    return out;
  }();
  DaemonOptions options;
  std::optional<std::string> server;
  ::opterr = 0;
  ::optind = 1;
  for (int c; (c = ::getopt_long(argc, argv, ":dh", kLong.data(), nullptr)) != -1;) {
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
              fmt::format("--log-level takes error, warn, info, debug or trace, not `{}`", arg));
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
      case kLaunchBatching: {
        const std::string_view value = arg;
        if (value == "off") {
          options.server_settings.set(server::Setting::kLaunchBatch, "0");
        } else if (value == "on") {
          // The server's default size, unless --server-launch-batch chose one.
          const std::string* size = options.server_settings.find(server::Setting::kLaunchBatch);
          if (size != nullptr && *size == "0") {
            options.server_settings.erase(server::Setting::kLaunchBatch);
          }
        } else {
          return tl::unexpected(fmt::format("--launch-batching {}: expected on or off", value));
        }
        break;
      }
      case kMetricsListen: {
        auto address = parse_metrics_address(arg);
        if (!address) return tl::unexpected(address.error());
        options.metrics_listen = std::move(*address);
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
        if (c >= kServerSetting &&
            c < kServerSetting + static_cast<int>(server::server_options().size())) {
          const auto& setting =
              server::server_options()[static_cast<std::size_t>(c - kServerSetting)];
          if (auto error = set_server_setting(options.server_settings, setting, arg)) {
            return tl::unexpected(*error);
          }
          break;
        }
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

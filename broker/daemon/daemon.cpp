#include "broker/daemon/daemon.hpp"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <system_error>

#include "broker/daemon/log.hpp"
#include "broker/daemon/metrics.hpp"
#include "broker/daemon/sizes.hpp"
#include "proto/abi.hpp"

namespace mpsshim::daemon {

namespace {

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&set, s);
  return set;
}

SupervisorConfig supervisor_config(const DaemonOptions& options) {
  SupervisorConfig config{options.server_path, options.driver_path, options.log_level, log_fd(),
                          options.restart_limit};
  config.server_settings = options.server_settings;
  config.isolation_idle_timeout = options.isolation_idle_timeout;
  config.isolation_max_servers = options.isolation_max_servers;
  config.nvidia_mps_pipe_directory = options.nvidia_mps_pipe_directory;
  return config;
}

}  // namespace

void Daemon::block_signals() {
  sigset_t set = handled_signals();
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a peer that hangs up is an error code, not a death
}

Daemon::Daemon(DaemonSetup setup)
    : setup_(std::move(setup)),
      supervisor_(loop_, supervisor_config(setup_.options),
                  Supervisor::Events{[this] { on_settled(); }, [this] { on_changed(); }}),
      classes_(setup_.options.classes),
      commands_(
          supervisor_, allocations_,
          [this] { loop_.after({}, [this] { shutdown("mpsshimctl quit"); }); },
          [this] { return reload_config(); }),
      gate_(loop_, supervisor_, commands_, allocations_,
            AccessPolicy{::geteuid(), setup_.multiuser}, setup_.options.isolation, &classes_,
            setup_.options.isolate_after_fault),
      metrics_(loop_, [this](auto done) { collect_metrics(std::move(done)); }),
      start_time_seconds_(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count()) {
  sigset_t set = handled_signals();
  signals_.reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signals_) throw std::system_error(errno, std::generic_category(), "signalfd");
  loop_.watch(signals_.get(), EPOLLIN, [this](std::uint32_t) { on_signal(); });

  ServerDefaults& defaults = supervisor_.defaults();
  defaults.sm_percentage = setup_.options.default_sm_percentage;
  defaults.memory_limit = setup_.options.default_memory_limit.value_or(0);
  allocations_.tokens_required = setup_.options.require_allocation_token;
}

void Daemon::run() {
  gate_.listen(std::move(setup_.listener));
  if (setup_.metrics_listener) metrics_.listen(std::move(setup_.metrics_listener));
  supervisor_.start();
  loop_.run();
  metrics_.close();
  gate_.close();
}

void Daemon::on_signal() {
  signalfd_siginfo info;
  while (::read(signals_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    switch (info.ssi_signo) {
      case SIGTERM:
      case SIGINT:
        shutdown(info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
        break;
      case SIGHUP:
        reopen_log_file();
        log_info("SIGHUP: log file reopened");
        if (setup_.options.config_path) {
          if (auto reloaded = reload_config(); !reloaded) log_error("{}", reloaded.error());
        }
        break;
      case SIGCHLD:
        supervisor_.reap();
        break;
      default:
        break;
    }
  }
}

void Daemon::collect_metrics(std::function<void(std::string)> done) {
  commands_.client_reports([this, done = std::move(done)](Commands::ClientReports reports) {
    for (ServerClients& server : reports.ps) {
      server.text = with_pod_fields(allocations_, server.text);
    }
    MetricsInput input{start_time_seconds_, setup_.version, proto::kAbiMajor, proto::kAbiMinor, {},
                       std::move(reports)};
    for (int i = 0; i < supervisor_.gpu_count(); ++i) {
      input.servers.push_back(supervisor_.status(i));
      input.group_servers.push_back(0);
      input.group_faults.push_back(supervisor_.past_group_faults(i));
    }
    input.client_faults = supervisor_.faults().by_culprit();
    for (auto& [slot, status] : supervisor_.group_servers()) {
      if (status.state == ServerState::kRunning && status.ordinal < supervisor_.gpu_count()) {
        input.group_servers[status.ordinal] += 1;
      }
    }
    done(format_metrics(input));
  });
}

std::string Daemon::status_line() const {
  int ready = 0;
  std::string others;
  for (int i = 0; i < supervisor_.gpu_count(); ++i) {
    ServerState state = supervisor_.status(i).state;
    if (state == ServerState::kRunning) {
      ++ready;
    } else {
      others += fmt::format(", GPU {} {}", i, state_name(state));
    }
  }
  return fmt::format("{} of {} GPU server{} running{}; socket {}", ready, supervisor_.gpu_count(),
                     supervisor_.gpu_count() == 1 ? "" : "s", others, setup_.socket_path);
}

void Daemon::on_settled() {
  ready_ = true;
  std::string status = status_line();
  log_info("ready: {}", status);
  setup_.notifier.send("READY=1\nSTATUS=" + status);
  bool every_server_running = supervisor_.gpu_count() > 0;
  for (int i = 0; i < supervisor_.gpu_count(); ++i) {
    every_server_running &= supervisor_.status(i).state == ServerState::kRunning;
  }
  if (setup_.on_ready) std::exchange(setup_.on_ready, nullptr)(every_server_running, status);
}

void Daemon::on_changed() {
  if (ready_ && !stopping_) setup_.notifier.send("STATUS=" + status_line());
}

void Daemon::shutdown(std::string_view reason) {
  if (stopping_) return;
  stopping_ = true;
  log_info("stopping ({}): no new connections; ending the servers", reason);
  setup_.notifier.send("STOPPING=1\nSTATUS=stopping");
  gate_.close();
  metrics_.close();
  ::unlink(setup_.socket_path.c_str());
  supervisor_.stop(setup_.options.stop_timeout, [this] { loop_.stop(); });
}

tl::expected<std::string, std::string> Daemon::reload_config() {
  if (!setup_.options.config_path) {
    return tl::unexpected(std::string("mpsshimd was started without --config; nothing to read"));
  }
  auto file = read_config_file(*setup_.options.config_path);
  if (!file) {
    return tl::unexpected(
        fmt::format("configuration not reloaded, the old one stays: {}", file.error()));
  }
  // The file's options alone (the command line's still win where it set them): the default
  // quotas change live; other options wait for the next start.
  std::vector<std::string> words{"mpsshimd"};
  words.insert(words.end(), file->arguments.begin(), file->arguments.end());
  std::vector<char*> pointers;
  for (std::string& word : words) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  auto options = parse_daemon_options(static_cast<int>(words.size()), pointers.data());
  if (!options) {
    return tl::unexpected(
        fmt::format("configuration not reloaded, the old one stays: {}", options.error()));
  }
  classes_ = std::move(file->classes);
  std::string changes = fmt::format("{}: {} class{} for new clients", file->path, classes_.size(),
                                    classes_.size() == 1 ? "" : "es");
  ServerDefaults& defaults = supervisor_.defaults();
  if (options->default_sm_percentage && options->default_sm_percentage != defaults.sm_percentage) {
    commands_.execute(
        fmt::format("set_default_active_thread_percentage {}", *options->default_sm_percentage),
        [](CtlReply reply) { log_info("reload: {}", reply.text); });
    changes += fmt::format("; default SM percentage {}", *options->default_sm_percentage);
  }
  if (options->default_memory_limit && *options->default_memory_limit != defaults.memory_limit) {
    defaults.memory_limit = *options->default_memory_limit;
    for (int gpu = 0; gpu < supervisor_.gpu_count(); ++gpu) {
      commands_.execute(fmt::format("set_default_device_pinned_mem_limit {} {}", gpu,
                                    *options->default_memory_limit),
                        [](CtlReply reply) { log_info("reload: {}", reply.text); });
    }
    changes +=
        fmt::format("; default memory limit {}", format_size(*options->default_memory_limit));
  }
  log_info("configuration reloaded from {}", changes);
  return changes;
}

}  // namespace mpsshim::daemon

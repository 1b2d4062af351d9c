// mpsshimd: see docs/daemon.md.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>

#include "broker/daemon/background.hpp"
#include "broker/daemon/config_file.hpp"
#include "broker/daemon/daemon.hpp"
#include "broker/daemon/log.hpp"
#include "broker/daemon/metrics.hpp"
#include "broker/daemon/options.hpp"
#include "broker/daemon/paths.hpp"
#include "broker/daemon/pid_file.hpp"
#include "broker/daemon/runtime_dir.hpp"
#include "proto/abi.hpp"

namespace {

using namespace mpsshim::daemon;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// Beyond its --stop-timeout, what a stopping daemon may take to kill its servers and exit.
constexpr std::chrono::seconds kStoppingDaemonGrace{5};

// fds 0-2 must be taken, or a socket could land on one and be clobbered when a server's stdio
// is set up.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);
  }
}

// Startup failures reach the person who started mpsshimd even when the log goes to a file.
int startup_failure(const std::string& message) {
  log_error("{}", message);
  if (log_fd() != STDERR_FILENO) fmt::print(stderr, "mpsshimd: {}\n", message);
  return kExitFailure;
}

void make_paths_absolute(DaemonOptions& options) {
  if (options.runtime_dir) options.runtime_dir = absolute_path(*options.runtime_dir);
  if (options.log_file) options.log_file = absolute_path(*options.log_file);
  if (options.driver_path) options.driver_path = absolute_path(*options.driver_path);
  if (options.config_path) options.config_path = absolute_path(*options.config_path);
  options.server_path = absolute_path(options.server_path);
}

int run(DaemonOptions options) {
  make_paths_absolute(options);
  set_log_level(options.log_level);
  Daemon::block_signals();
  Notifier notifier = Notifier::from_environment();

  bool multiuser = options.multiuser;
  if (multiuser && ::geteuid() != 0) {
    log_warn("--multiuser ignored: only a daemon running as root may serve other users");
    multiuser = false;
  }
  RuntimeDir dir = choose_runtime_dir(options.runtime_dir);
  dir.path = absolute_path(dir.path);
  if (auto prepared = prepare_runtime_dir(dir.path, multiuser); !prepared) {
    return startup_failure(prepared.error());
  }
  if (!options.nvidia_mps_pipe_directory.empty()) {
    if (auto checked = check_nvidia_mps_pipe_directory(options.nvidia_mps_pipe_directory, dir.path);
        !checked) {
      return startup_failure(checked.error());
    }
  }
  if (!options.log_file && options.daemonize) options.log_file = dir.path + "/mpsshimd.log";
  if (options.log_file) {
    if (auto opened = open_log_file(*options.log_file); !opened) {
      return startup_failure(opened.error());
    }
  }
  std::string socket_path = control_socket_path(dir.path);
  auto pid_file = PidFile::acquire(pid_file_path(dir.path));
  if (!pid_file && !socket_answers(socket_path)) {
    // A daemon that holds the directory but no longer answers is stopping: `mpsshimctl quit`
    // returns once it stops listening, while it still ends its servers. Waiting for it makes
    // `mpsshimctl quit && mpsshimd -d` a restart rather than a race.
    log_info("the mpsshimd that holds {} is stopping; waiting for it to exit", dir.path);
    if (PidFile::wait_for_holder_to_exit(pid_file_path(dir.path),
                                         options.stop_timeout + kStoppingDaemonGrace)) {
      pid_file = PidFile::acquire(pid_file_path(dir.path));
    }
  }
  if (!pid_file) return startup_failure(pid_file.error());
  if (socket_answers(socket_path)) {
    return startup_failure(
        fmt::format("another mpsshimd already answers on {}; stop it with `mpsshimctl quit` or "
                    "give this one another --runtime-dir",
                    socket_path));
  }
  // Before the control socket, so a metrics address that cannot be bound leaves nothing behind.
  std::optional<MetricsListener> metrics;
  if (options.metrics_listen) {
    auto listening = listen_metrics(*options.metrics_listen);
    if (!listening) return startup_failure(listening.error());
    metrics = std::move(*listening);
  }

  int listener = proto::listen_seqpacket(socket_path);
  if (listener < 0) {
    return startup_failure(
        fmt::format("cannot listen on {}: {}", socket_path, std::strerror(-listener)));
  }
  proto::UniqueFd listener_fd(listener);
  ::fcntl(listener, F_SETFL, O_NONBLOCK);
  // Clients connect with write permission on the socket; the directory mode already keeps
  // strangers out in single-user mode.
  ::chmod(socket_path.c_str(), multiuser ? 0666 : 0600);

  std::optional<Background> background;
  if (options.daemonize) {
    auto entered = Background::enter(*options.log_file);
    if (!entered) return startup_failure("cannot run in the background: " + entered.error());
    background = std::move(*entered);
  }
  if (auto written = pid_file->write_pid(); !written) log_warn("{}", written.error());

  log_info("mpsshimd {} (ABI {}.{}) starting in {} ({}); {}; server {}{}", MPSSHIM_VERSION,
           proto::kAbiMajor, proto::kAbiMinor, dir.path, dir.reason,
           multiuser ? "serving every uid" : fmt::format("serving uid {} only", ::geteuid()),
           options.server_path,
           options.nvidia_mps_pipe_directory.empty()
               ? ""
               : fmt::format(", run as a client of NVIDIA MPS in {}",
                             options.nvidia_mps_pipe_directory));
  int status = 0;
  try {
    DaemonSetup setup{options, multiuser, socket_path, std::move(listener_fd), std::move(notifier),
                      nullptr};
    if (background) {
      setup.on_ready = [&background](bool every_server_running, const std::string& status) {
        background->ready(every_server_running, status);
      };
    }
    setup.version = MPSSHIM_VERSION;
    if (metrics) {
      log_info("metrics: listening on {} (http://{}/metrics)",
               format_metrics_address(metrics->actual), format_metrics_address(metrics->actual));
      setup.metrics_listener = std::move(metrics->fd);
    }
    Daemon daemon(std::move(setup));
    daemon.run();
    log_info("stopped");
  } catch (const std::exception& e) {
    log_error("fatal: {}", e.what());
    status = kExitFailure;
  }
  ::unlink(socket_path.c_str());
  pid_file->remove();
  return status;
}

}  // namespace

// The options of --config FILE, then the command line's, which win (docs/config.md).
tl::expected<DaemonOptions, std::string> options_with_config(int argc, char** argv,
                                                             DaemonOptions first) {
  if (!first.config_path || first.help || first.version) return first;
  auto file = read_config_file(*first.config_path);
  if (!file) return tl::unexpected(file.error());
  std::vector<std::string> words{argv[0]};
  words.insert(words.end(), file->arguments.begin(), file->arguments.end());
  words.insert(words.end(), argv + 1, argv + argc);
  std::vector<char*> pointers;
  for (std::string& word : words) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  auto options = parse_daemon_options(static_cast<int>(words.size()), pointers.data());
  if (options) options->classes = std::move(file->classes);
  return options;
}

int main(int argc, char** argv) {
  ensure_standard_fds();
  configure_daemon_log("mpsshimd");
  set_log_level(LogLevel::kInfo);
  auto options = parse_daemon_options(argc, argv);
  if (options) options = options_with_config(argc, argv, std::move(*options));
  if (!options) {
    fmt::print(stderr, "mpsshimd: {}\nrun `mpsshimd --help` for the options\n", options.error());
    return kExitUsage;
  }
  if (options->help) {
    fmt::print("{}", daemon_usage());
    return 0;
  }
  if (options->version) {
    fmt::print("mpsshimd {} (mpsshim ABI {}.{})\n", MPSSHIM_VERSION, proto::kAbiMajor,
               proto::kAbiMinor);
    return 0;
  }
  return run(std::move(*options));
}

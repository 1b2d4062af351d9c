// mpsshimd put together: the event loop, the servers, the front door, the operator commands,
// signals and systemd notification.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "broker/daemon/allocations.hpp"
#include "broker/daemon/client_gate.hpp"
#include "broker/daemon/commands.hpp"
#include "broker/daemon/event_loop.hpp"
#include "broker/daemon/metrics_server.hpp"
#include "broker/daemon/options.hpp"
#include "broker/daemon/sd_notify.hpp"
#include "broker/daemon/supervisor.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

struct DaemonSetup {
  DaemonOptions options;   // paths already absolute
  bool multiuser = false;  // as honoured (root only)
  std::string socket_path;
  proto::UniqueFd listener;  // listening, non-blocking
  Notifier notifier;
  // -d: release the waiting parent, saying whether every GPU's server runs and the status line.
  std::function<void(bool, const std::string&)> on_ready;
  proto::UniqueFd metrics_listener{};  // --metrics-listen: listening TCP socket; else none
  std::string version{};               // for mpsshim_build_info
};

class Daemon {
 public:
  // SIGTERM, SIGINT, SIGHUP and SIGCHLD are read through a signalfd; block them before any
  // server is started (call this first thing) so none is lost or inherited as a handler.
  static void block_signals();

  explicit Daemon(DaemonSetup setup);
  void run();  // returns after a clean shutdown

 private:
  void on_signal();
  void on_settled();
  void on_changed();
  void shutdown(std::string_view reason);
  void collect_metrics(std::function<void(std::string)> done);
  std::string status_line() const;
  // --config FILE again (SIGHUP, mpsshimctl reload): new classes for new clients and new default
  // quotas for every server; the answer says what changed, or why the file was refused (the
  // old configuration stays).
  tl::expected<std::string, std::string> reload_config();

  DaemonSetup setup_;
  EventLoop loop_;
  Supervisor supervisor_;
  AllocationRegistry allocations_;    // the event loop's; commands change it, the gate reads it
  std::vector<ClientClass> classes_;  // the event loop's; a reload replaces them, the gate reads
  Commands commands_;
  ClientGate gate_;
  MetricsServer metrics_;
  double start_time_seconds_ = 0;  // unix time
  proto::UniqueFd signals_;
  bool ready_ = false;
  bool stopping_ = false;
};

}  // namespace mpsshim::daemon

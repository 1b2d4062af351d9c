// The server processes: started, watched, restarted with backoff, and talked to.
//
// Each GPU has its shared server, started with the daemon. Discovery needs no CUDA here: the
// server for GPU 0 starts first and its ServerReady says how many GPUs there are; then the
// others start. A shared server that dies is restarted after 0.1 s, doubling up to 5 s while it
// keeps failing within kStableUptime of its start; after restart_limit such failures in a row
// the GPU is marked failed and left alone.
//
// An isolation group (docs/isolation.md) gets servers of its own, one per GPU it uses, started
// when its first client of that GPU attaches and stopped once no client has used it for
// --isolation-idle-timeout. Each is a process with its own CUDA context, so groups do not see
// each other's memory and a fault in one ends only that group's clients. A group server that
// dies is not restarted: the group's next client starts a new one.
//
// Every server has a slot: the shared server of GPU n is slot n, group servers come after the
// GPUs and their slots are never reused. Requests address slots.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <tl/expected.hpp>

#include "broker/daemon/child_process.hpp"
#include "broker/daemon/event_loop.hpp"
#include "broker/daemon/fault_log.hpp"
#include "broker/daemon/log.hpp"
#include "broker/server/core/option_table.hpp"
#include "broker/daemon/sm_partitions.hpp"
#include "proto/control.hpp"
#include "proto/text_parts.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

enum class ServerState { kStarting, kRunning, kRestarting, kFailed, kStopping, kStopped };
std::string_view state_name(ServerState state);

// What the operator set with set_default_*: passed to a server on its command line when it
// starts, and sent to running servers when it changes.
struct ServerDefaults {
  std::optional<int> sm_percentage;
  std::uint64_t memory_limit = 0;                    // every GPU; 0 = no limit
  std::map<int, std::uint64_t> memory_limit_by_gpu;  // set for one GPU; 0 = no limit

  std::uint64_t memory_limit_of(int gpu) const {
    auto it = memory_limit_by_gpu.find(gpu);
    return it != memory_limit_by_gpu.end() ? it->second : memory_limit;
  }
};

struct SupervisorConfig {
  std::string server_path;
  std::optional<std::string> driver_path;
  LogLevel log_level = LogLevel::kInfo;
  int output_fd = -1;  // the servers' stdout/stderr; -1 = the daemon's
  int restart_limit = 5;
  // Passed to every server after --device, --control-fd, --driver and --log-level.
  server::PassedSettings server_settings{};
  // Isolation groups: how long a group's server may go without clients before it is stopped,
  // and how many group servers one GPU may run at once.
  std::chrono::seconds isolation_idle_timeout{60};
  int isolation_max_servers = 16;
  // Non-empty: every server is a client of the NVIDIA MPS daemon of this pipe directory.
  std::string nvidia_mps_pipe_directory{};
};

// What a server needs to take a client: who it is and the quota the daemon decided.
struct Admission {
  proto::PeerCredentials peer{};
  proto::ClientHello hello{};
  std::uint32_t allocation_id = 0;  // 0 = none (docs/kubernetes.md)
  std::uint64_t allocation_memory_limit = 0;
  std::uint32_t sm_slot = 0;
  std::uint32_t sm_slots = 0;
  std::optional<SmPartition> partition{};
};

// What the rest of the daemon may know about one GPU's server.
struct ServerStatus {
  int ordinal = 0;
  ServerState state = ServerState::kStarting;
  pid_t pid = 0;  // the running process; 0 while none runs
  int restarts = 0;
  int gpu_faults = 0;  // exits with status 70 (the server's sticky-GPU-fault exit)
  std::string group;   // its isolation group; "" for the GPU's shared server
  std::optional<proto::DeviceSnapshot> snapshot;  // from its last successful ServerReady
  std::string problem;  // why it is not ready, in words ("exited with status 70 (GPU fault)")
};

// A server's answer to a text request: kServerStats for kServerStatsQuery, kCtlReply otherwise.
struct ServerAnswer {
  int status = 0;
  std::string text;
};
using AnswerHandler = std::function<void(tl::expected<ServerAnswer, std::string>)>;

class Supervisor {
 public:
  static constexpr auto kStableUptime = std::chrono::seconds(10);
  static constexpr auto kReadyTimeout = std::chrono::seconds(60);
  static constexpr auto kFirstBackoff = std::chrono::milliseconds(100);
  static constexpr auto kMaxBackoff = std::chrono::seconds(5);
  static constexpr auto kHangupGrace = std::chrono::seconds(1);  // < Commands::kServerTimeout
  static constexpr std::size_t kMaxGpus = 64;
  static constexpr std::size_t kMaxPendingRequests = 32;
  // An idle isolation-group server is sent SIGTERM, and SIGKILL this long after.
  static constexpr auto kGroupStopGrace = std::chrono::seconds(5);

  struct Events {
    std::function<void()> settled;  // once: every server is ready or failed
    std::function<void()> changed;  // any server changed state
  };

  Supervisor(EventLoop& loop, SupervisorConfig config, Events events);
  ~Supervisor();

  void start();

  // 1 until GPU 0's server has said how many GPUs there are.
  int gpu_count() const { return gpu_count_; }
  bool gpu_count_known() const { return gpu_count_known_; }
  // The shared server of GPU `ordinal`.
  const ServerStatus& status(int ordinal) const { return servers_.at(ordinal)->status; }

  // The slots of every server of GPU `ordinal` that runs now: its shared server's (when it
  // runs) first, then its isolation groups'.
  std::vector<int> running_slots(int ordinal) const;
  // The servers of isolation groups, by slot, whatever their state.
  std::vector<std::pair<int, ServerStatus>> group_servers() const;
  // The status of the server in `slot`; nullptr once a group server has gone.
  const ServerStatus* status_of_slot(int slot) const;
  // GPU faults of group servers that have gone, per GPU (the metrics count them).
  int past_group_faults(int ordinal) const;
  // The faults the servers reported, with their likely culprits.
  const FaultLog& faults() const { return faults_; }

  ServerDefaults& defaults() { return defaults_; }

  // Hands a client connection to the server of GPU `ordinal` (kServerAdmit + a copy of the fd;
  // the caller closes its own). Returns the server's pid, or why the client cannot have this
  // GPU now.
  // `allocation_id` (0 = none) and its shared memory limit go with it (docs/kubernetes.md).
  tl::expected<pid_t, std::string> admit(int ordinal, int client_fd, const Admission& admission);
  // The same for isolation group `group` ("": the shared server, as admit()): starts the
  // group's server of that GPU first when there is none, keeping the client's connection until
  // it is ready. `done` runs exactly once, with the server's pid or why the client cannot have
  // the GPU (possibly before admit_to_group returns).
  using AdmitDone = std::function<void(tl::expected<pid_t, std::string>)>;
  void admit_to_group(const std::string& group, int ordinal,
                      std::shared_ptr<proto::UniqueFd> client_fd, Admission admission,
                      AdmitDone done);
  // The static SM partitions of every GPU (sm_partitions.hpp).
  SmPartitionTable& partitions() { return partitions_; }

  // Sends a TextMessage of `kind` to the server in `slot` (GPU n's shared server: n); `handler`
  // runs exactly once, with the answer or with why there is none (possibly before request()
  // returns).
  void request(int slot, proto::MessageKind kind, std::string_view text,
               std::chrono::milliseconds timeout, AnswerHandler handler);

  // SIGTERM every server, SIGKILL what is left after `grace`; `done` runs when all are gone.
  void stop(std::chrono::milliseconds grace, std::function<void()> done);

  // SIGCHLD: collect any server that exited (the pidfd path usually got there first).
  void reap();

 private:
  struct PendingAnswer {
    std::uint64_t id;
    proto::MessageKind expected;
    proto::TextAssembly parts;  // a long answer comes in parts (proto/text_parts.hpp)
  };
  struct WaitingClient {
    std::shared_ptr<proto::UniqueFd> fd;
    Admission admission;
    AdmitDone done;
  };
  struct Server {
    ServerStatus status;
    int slot = 0;
    ChildProcess process;
    proto::UniqueFd control;
    std::uint64_t incarnation = 0;
    Clock::time_point started{};
    bool was_ready = false;
    bool start_failed = false;
    int fast_failures = 0;
    EventLoop::TimerId timer = 0;       // ready deadline or restart backoff
    std::deque<PendingAnswer> pending;  // requests in the order the server answers them
    // Isolation-group servers only: clients waiting for it to be ready, and its idleness as the
    // idle poll (poll_group_servers) saw it.
    std::vector<WaitingClient> waiting;
    bool admitted_since_poll = false;
    std::optional<Clock::time_point> idle_since;
  };
  struct Request {
    AnswerHandler handler;
    EventLoop::TimerId timer;
    std::string server;  // name() when it was sent
    std::chrono::milliseconds timeout;
  };

  // The server in `slot`, or nullptr once a group server has gone.
  Server* at(int slot) const;
  bool is_group(const Server& server) const { return !server.status.group.empty(); }
  void spawn(int slot);
  std::vector<std::string> server_arguments(const Server& server) const;
  tl::expected<pid_t, std::string> send_admit(Server& server, int client_fd,
                                              const Admission& admission);
  // A group server became ready or could not start: its waiting clients are admitted or told.
  void settle_waiting(Server& server);
  // Ends a group server that is gone or could not start: its slot empties.
  void forget_group_server(Server& server, const std::string& why);
  std::chrono::milliseconds group_poll_interval() const;
  void poll_group_servers();
  void on_group_poll_answer(int slot, std::uint64_t incarnation,
                            const tl::expected<ServerAnswer, std::string>& answer);
  void on_control_readable(int slot, std::uint64_t incarnation);
  void on_message(Server& server, const proto::Received& message);
  void on_ready(Server& server, const proto::ServerReady& ready);
  void on_fault_report(Server& server, const proto::Received& message);
  void on_answer(Server& server, proto::MessageKind kind, const proto::Received& message);
  void learn_gpu_count(int count);
  void try_reap(int slot);
  void on_exit(Server& server, int wait_status);
  void schedule_restart(Server& server, std::string_view what_happened, bool fast);
  void fail_pending(Server& server, const std::string& why);
  void expire_request(std::uint64_t id);
  void set_state(Server& server, ServerState state);
  // Why `server` cannot take clients or requests now; nullopt when it can.
  std::optional<std::string> unavailable(const Server& server) const;
  void check_settled();
  void finish_stop();
  std::string name(const Server& server) const;

  EventLoop& loop_;
  SupervisorConfig config_;
  Events events_;
  ServerDefaults defaults_;
  SmPartitionTable partitions_;  // the event loop's, like everything here
  // Slot-indexed; an isolation group's slot is empty once its server has gone.
  std::vector<std::unique_ptr<Server>> servers_;
  int gpu_count_ = 1;
  bool gpu_count_known_ = false;
  std::map<int, int> past_group_faults_;  // GPU -> faults of group servers gone
  FaultLog faults_;
  EventLoop::TimerId group_poll_ = 0;  // while any group server runs
  bool settled_ = false;
  bool stopping_ = false;
  std::function<void()> stop_done_;
  std::vector<EventLoop::TimerId> stop_timers_;
  std::unordered_map<std::uint64_t, Request> requests_;
  std::uint64_t next_request_ = 1;
  proto::Received scratch_;  // reused: receive_message sizes it to the largest message
};

}  // namespace mpsshim::daemon

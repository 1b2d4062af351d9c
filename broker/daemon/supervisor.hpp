// One server process per GPU: started, watched, restarted with backoff, and talked to.
//
// Discovery needs no CUDA here: the server for GPU 0 starts first and its ServerReady says how
// many GPUs there are; then the others start. A server that dies is restarted after 0.1 s,
// doubling up to 5 s while it keeps failing within kStableUptime of its start; after
// restart_limit such failures in a row the GPU is marked failed and left alone.
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
#include "broker/daemon/log.hpp"
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
  std::optional<int> server_workers;          // passed as --workers; unset: the server's default
  std::optional<int> context_idle_timeout_s;  // passed as --context-idle-timeout
  // Passed as --launch-batch; unset: the server's default. Last, with an initializer:
  // supervisor_config's aggregate lists the fields before it.
  std::optional<int> server_launch_batch{};
  std::optional<int> server_launch_batch_min{};             // passed as --launch-batch-min
  std::optional<int> server_launch_batch_ramp{};            // passed as --launch-batch-ramp
  std::optional<std::string> server_launch_batch_graphs{};  // passed as --launch-batch-graphs
  bool server_busy_time = false;                            // passed as --busy-time on
  bool server_host_fences = true;                           // false: passed as --host-fences off
  std::optional<int> server_crowded_fence_max_queued{};     // passed as --crowded-fence-max-queued
  bool server_share_images = true;                          // false: passed as --share-images off
  std::optional<int> server_image_idle_timeout_s{};         // passed as --image-idle-timeout
  std::optional<int> server_event_poll_us{};                // passed as --event-poll-us
  std::optional<int> server_spin_clients{};                 // passed as --spin-clients
  bool server_priority_scheduling = true;              // false: passed as --priority-scheduling off
  std::optional<int> server_priority_max_hold_us{};    // passed as --priority-max-hold-us
  std::optional<int> server_priority_fence_poll_us{};  // passed as --priority-fence-poll-us
  std::optional<std::string> server_priority_reserve_sms{};  // passed as --priority-reserve-sms
  // Per-client caps, "NAME=N" each (N in bytes for sizes), passed as --client-limit NAME=N.
  std::vector<std::string> client_limits{};
};

// What the rest of the daemon may know about one GPU's server.
struct ServerStatus {
  int ordinal = 0;
  ServerState state = ServerState::kStarting;
  pid_t pid = 0;  // the running process; 0 while none runs
  int restarts = 0;
  int gpu_faults = 0;  // exits with status 70 (the server's sticky-GPU-fault exit)
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

  struct Events {
    std::function<void()> settled;  // once: every server is ready or failed
    std::function<void()> changed;  // any server changed state
  };

  Supervisor(EventLoop& loop, SupervisorConfig config, Events events);
  ~Supervisor();

  void start();

  // 1 until GPU 0's server has said how many GPUs there are.
  int gpu_count() const { return static_cast<int>(servers_.size()); }
  bool gpu_count_known() const { return gpu_count_known_; }
  const ServerStatus& status(int ordinal) const { return servers_.at(ordinal)->status; }

  ServerDefaults& defaults() { return defaults_; }

  // Hands a client connection to the server of GPU `ordinal` (kServerAdmit + a copy of the fd;
  // the caller closes its own). Returns the server's pid, or why the client cannot have this
  // GPU now.
  // `allocation_id` (0 = none) and its shared memory limit go with it (docs/kubernetes.md).
  tl::expected<pid_t, std::string> admit(int ordinal, int client_fd,
                                         const proto::PeerCredentials& peer,
                                         const proto::ClientHello& hello,
                                         std::uint32_t allocation_id = 0,
                                         std::uint64_t allocation_memory_limit = 0,
                                         std::uint32_t sm_slot = 0, std::uint32_t sm_slots = 0,
                                         const SmPartition* partition = nullptr);
  // The static SM partitions of every GPU (sm_partitions.hpp).
  SmPartitionTable& partitions() { return partitions_; }

  // Sends a TextMessage of `kind` to GPU `ordinal`'s server; `handler` runs exactly once, with
  // the answer or with why there is none (possibly before request() returns).
  void request(int ordinal, proto::MessageKind kind, std::string_view text,
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
  struct Server {
    ServerStatus status;
    ChildProcess process;
    proto::UniqueFd control;
    std::uint64_t incarnation = 0;
    Clock::time_point started{};
    bool was_ready = false;
    bool start_failed = false;
    int fast_failures = 0;
    EventLoop::TimerId timer = 0;       // ready deadline or restart backoff
    std::deque<PendingAnswer> pending;  // requests in the order the server answers them
  };
  struct Request {
    AnswerHandler handler;
    EventLoop::TimerId timer;
    int ordinal;
    pid_t pid;
    std::chrono::milliseconds timeout;
  };

  void spawn(int ordinal);
  std::vector<std::string> server_arguments(int ordinal) const;
  void on_control_readable(int ordinal, std::uint64_t incarnation);
  void on_message(Server& server, const proto::Received& message);
  void on_ready(Server& server, const proto::ServerReady& ready);
  void on_answer(Server& server, proto::MessageKind kind, const proto::Received& message);
  void learn_gpu_count(int count);
  void try_reap(int ordinal);
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
  std::vector<std::unique_ptr<Server>> servers_;
  bool gpu_count_known_ = false;
  bool settled_ = false;
  bool stopping_ = false;
  std::function<void()> stop_done_;
  std::vector<EventLoop::TimerId> stop_timers_;
  std::unordered_map<std::uint64_t, Request> requests_;
  std::uint64_t next_request_ = 1;
  proto::Received scratch_;  // reused: receive_message sizes it to the largest message
};

}  // namespace mpsshim::daemon

// mpsshim-server's coordinator: one per GPU, on the main thread. It owns the control socket to
// the daemon, admits clients (green context, segment, staging registration) and places each
// new session on the least-loaded worker (worker.hpp), which serves it from then on. Operator
// requests (ps, stats, terminate_client) and shutdown reach the sessions through the workers'
// mailboxes; a sticky GPU fault found by any worker reaches every worker's sessions before the
// process exits 70. See docs/architecture.md.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/server/core/heap_trim.hpp"
#include "broker/server/core/idle_strategy.hpp"
#include "broker/server/core/worker.hpp"
#include "broker/server/driver/gpu.hpp"
#include "broker/server/images/image_cache.hpp"
#include "broker/server/scheduling/context_lease.hpp"
#include "broker/server/scheduling/green_context_pool.hpp"
#include "broker/server/session/ipc_registry.hpp"
#include "broker/server/session/session.hpp"
#include "proto/control.hpp"
#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

struct ServerSettings {
  int default_sm_percentage = 100;  // for clients that set no CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
  std::uint64_t default_memory_limit = 0;  // for clients that set no limit; 0 = none
  proto::SegmentGeometry geometry{};
  std::size_t batch_per_client = 32;  // records per client per pass
  std::size_t workers = 0;  // worker threads, sessions sharded over them; 0: one per CPU it may use
  LaunchBatchSettings launch_batch;  // launch_batch.hpp (mpsshim-server --launch-batch)
  // GPU busy time per client (busy_time.hpp, mpsshim-server --busy-time on). Off by default:
  // its timing events cost the launch path (ResNet-50 b1 x 8 on an H100, one lease: 640-846
  // iters/s with it, 1,143-1,192 without; docs/benchmarks.md).
  bool busy_time = false;
  // Synchronizing calls learn of completion from a word the GPU writes (host_fences.hpp,
  // mpsshim-server --host-fences). On by default: see host_fences.hpp for the measurement.
  bool host_fences = true;
  // A spinning client watches its synchronize's host fence and wakes the sleeping worker when it
  // lands (session/fence_watch.hpp, mpsshim-server --fence-watch): the client is sent the
  // watch page. Off: every owed answer is polled.
  bool fence_watch = true;
  // While the server is crowded, a synchronize gets a host fence only when at most this many
  // operations were queued on its stream since it was last known idle; otherwise always
  // (host_fences.hpp, mpsshim-server --crowded-fence-max-queued).
  std::uint64_t crowded_fence_max_queued = kCrowdedFenceMaxQueued;
  // How often a completion without a host fence asks the driver about its event
  // (mpsshim-server --event-poll-us; 0: on every pass). Every cuEventQuery takes a driver lock
  // that other workers' launches wait for (docs/architecture.md, the path of one launch).
  std::chrono::microseconds event_poll{kDefaultEventPoll};
  // Per-client caps on streams, events, modules, pinned memory... (client_limits.hpp,
  // mpsshim-server --client-limit NAME=N).
  ClientLimits client_limits;
  // The primary context is released after this long without a client (context_lease.hpp);
  // negative: kept for the server's life. As long as shared library images are kept by
  // default (image_idle_timeout), which go with the context, and longer than a PyTorch
  // program's import (7-12 s on an H200 host), so that one started with the daemon finds it.
  std::chrono::milliseconds context_idle_timeout{std::chrono::seconds(60)};
  // Below-normal clients held back while normal ones have work in flight (priority_gate.hpp;
  // mpsshim-server --priority-scheduling).
  PrioritySettings priority;
  // Idle green contexts kept for later sessions at most (green_context_pool.hpp); 0: none kept.
  // Not an option of mpsshim-server: the tests set it, the server keeps the default.
  std::size_t green_context_pool = kDefaultGreenContextPoolCapacity;
  // With more clients than this, the server tells them it is crowded (SessionControl::crowded):
  // their waiting threads sleep after a short spin instead of yielding the CPUs the workers
  // need (libshim/wait_policy.hpp; mpsshim-server --spin-clients). Unset: half the CPUs the
  // server may run on, at least one (each spinning client holds a CPU; so does a busy worker).
  std::optional<std::size_t> spin_clients;
  // Library images without device variables are loaded once for every session that sends the
  // same bytes (image_cache.hpp; mpsshim-server --share-images).
  bool share_images = true;
  // A shared library no session holds stays loaded this long for the next client (zero: unloaded
  // with its last holder; image_cache.hpp; mpsshim-server --image-idle-timeout).
  std::chrono::seconds image_idle_timeout = kDefaultImageIdleTimeout;
  // Where the image scan's verdicts are kept across restarts (image_verdicts.hpp); empty: not.
  std::string image_verdict_dir;
  // What happens to a cuMemAlloc, cuMemAllocPitch or cuMemCreate that does not fit
  // (memory_arbiter.hpp; --memory-preemption, --preemption-idle-ms, --memory-overcommit). Off by
  // default.
  MemoryPolicySettings memory_policy;
  // Page-locked host memory kept ready for suspends while the primary context is held
  // (park_pool.hpp; --park-pool); 0: none.
  std::uint64_t park_pool = 0;
};

// The process exit code after a sticky GPU fault: the daemon starts a fresh server.
inline constexpr int kExitGpuFault = 70;

// Worker threads by default: the CPUs this process may run on (sched_getaffinity).
std::size_t default_worker_count();
// `settings` with what it leaves to the machine worked out: the workers and spin_clients.
ServerSettings with_machine_defaults(ServerSettings settings);

class Server final {
 public:
  Server(Gpu gpu, ServerSettings settings, proto::UniqueFd control);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Inline mode (tests): one pass of the coordinator and of every worker on the calling
  // thread; returns the amount of work done (0 = idle).
  std::size_t do_work();
  // Threaded mode: starts the workers, then serves the control socket until the server is
  // finished (control socket closed or `stop`, and every session freed) or a fault. Returns
  // the process exit code.
  int run(const std::atomic<bool>& stop);

  // A client connection from the daemon (public for tests).
  void admit(const proto::ServerAdmit& admit, proto::UniqueFd client);
  // Ends every session, then the server finishes.
  void shutdown(const std::string& reason);
  bool finished() const;
  bool faulted() const { return fault_.load(std::memory_order_acquire) != CUDA_SUCCESS; }

  // What happens after a sticky fault has been reported to every client. Default: exit(70).
  void set_fatal_handler(std::function<void(int)> handler) { fatal_ = std::move(handler); }

  // One line per client: the `ps` fields, or with `accounting` the per-client figures of
  // session_stats.hpp (mpsshimctl stats). Every line names the worker that serves the client.
  std::string stats_text(bool accounting = false);
  const Gpu& gpu() const { return gpu_; }
  // Green contexts of finished sessions, kept for the next ones (tests, the log at exit).
  GreenContextPoolFigures green_context_pool() const { return green_pool_.figures(); }
  // The interprocess handles of its clients (tests: entries back to 0 once they are gone).
  IpcRegistry& ipc_registry() { return ipc_; }
  // Libraries loaded once for several sessions (tests, `mpsshimctl stats`, the log at exit).
  ImageCache& image_cache() { return images_; }
  bool context_held() const { return lease_.held(); }
  const ServerSettings& settings() const { return settings_; }
  std::size_t session_count() const;
  // Inline mode or a worker's own thread only: sessions belong to their worker.
  Session* find_session(std::uint32_t client_id) const;
  std::size_t worker_count() const { return workers_.size(); }
  Worker& worker(std::size_t i) { return *workers_[i]; }

  // ---- called by workers (any thread) -----------------------------------------------------
  // The first sticky error of the process: logged once; every worker then fails its sessions.
  // Returns true for the call that raised it first.
  bool raise_fault(const Session* culprit, CUresult error, proto::Op op);
  CUresult fault() const { return fault_.load(std::memory_order_acquire); }
  // The client whose work first returned the sticky fault: its likely cause (another client's
  // kernel may have run beside it, so "likely"). Named to every client, the log and the daemon.
  struct FaultCulprit {
    std::uint32_t client = 0;  // the session's id; 0: none known (the fault came from no call)
    pid_t pid = 0;
    uid_t uid = 0;
    std::string program;
    std::string op;           // the call that returned it ("CtxSynchronize", "queued")
    std::size_t clients = 0;  // the sessions the fault ends
  };
  // Once faulted(): the culprit, after waiting (bounded) for raise_fault's winner to have
  // written it; none known when that winner was held up past the bound.
  const FaultCulprit& fault_culprit() const;
  // fail_sessions on a worker: it stored the sticky fault in all its sessions (phase 1), then
  // answered everything they were owed (phase 2; the coordinator exits after every worker's).
  void worker_stored_fault();
  void worker_failed_sessions();
  // Until every worker has (true) or `timeout` passed (false).
  bool await_fault_stored(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // Something for the coordinator to look at (a fault spread, a session freed).
  void wake();
  // A worker took a session (adopt) or freed one: the count behind crowded(); after a free the
  // coordinator may give the heap it left back (heap_trim.hpp).
  void session_placed() { placed_sessions_.fetch_add(1, std::memory_order_relaxed); }
  void session_freed() {
    placed_sessions_.fetch_sub(1, std::memory_order_relaxed);
    heap_trimmer_.session_freed();
    wake();
  }
  // More clients than ServerSettings::spin_clients: each worker tells its sessions between
  // passes (Worker::tell_crowded).
  bool crowded() const {
    return placed_sessions_.load(std::memory_order_relaxed) > *settings_.spin_clients;
  }
  // What the sessions are told (proto::SessionControl::crowded): 0; proto::kCrowded while
  // crowded(); proto::kCrowdedPastCpus while there are more clients than CPUs it may run on too.
  std::uint32_t crowded_level() const {
    const std::size_t sessions = placed_sessions_.load(std::memory_order_relaxed);
    if (sessions <= *settings_.spin_clients) return 0;
    return sessions > cpus_ ? proto::kCrowdedPastCpus : proto::kCrowded;
  }
  std::size_t clients_on_gpu() const { return session_count(); }
  // Which priority classes have clients here, and how many normal ones have work in flight.
  PriorityBoard& priority_board() { return priority_board_; }
  // The SMs below-normal clients leave to normal ones (priority_reserve.hpp); planned at start.
  const SmReserve& sm_reserve() const { return sm_reserve_; }
  // A normal-priority session joined or left: every worker looks at its below-normal sessions
  // at its next pass, idle or not (priority_reserve.hpp).
  void nudge_workers();

  // A kCtlRequest from the daemon (control.cpp): the defaults for new clients, and a running
  // client's quotas changed live (set_client_active_thread_percentage PID P,
  // set_client_memory_limit PID BYTES) or suspended and resumed (suspend_client PID,
  // resume_client PID), applied by the worker that owns the client. The answer;
  // `status` 1 when it failed. Tests call it directly in inline mode.
  std::string control_command(const std::string& text, int& status);

 private:
  // Runs `task` on every worker and returns what each returned, in worker order: posted and
  // waited for (at most `timeout` per worker) when threaded, called directly when inline.
  std::vector<std::string> on_each_worker(const std::function<std::string(Worker&)>& task,
                                          std::chrono::milliseconds timeout);
  Worker& least_loaded();
  void plan_priority_reserve();
  std::size_t poll_control(std::chrono::nanoseconds timeout);
  void finish_fault();
  // Tells the daemon the fault and its likely culprit (kServerFault) before the server exits.
  void report_fault_to_daemon();

  // control.cpp
  std::size_t read_control();
  void on_control_message(proto::Received& message);
  void reply_text(proto::MessageKind kind, int status, const std::string& text);
  std::string terminate_client(const std::string& text, int& status);
  std::string client_quota_command(const std::string& command, const std::string& pid_text,
                                   std::istream& rest, int& status);
  // suspend_client PID / resume_client PID (session/suspension.hpp), on the client's worker.
  std::string suspend_command(const std::string& command, const std::string& pid_text, int& status);

  // memory_policy.cpp: the memory policies' coordinator side (scheduling/memory_arbiter.hpp).
  // Runs `task` on the worker of active session `client` (on_each_worker); false when none has
  // it. `task` is copied: it may run after the timeout.
  bool on_session(std::uint32_t client, std::function<void(Session&)> task,
                  std::chrono::milliseconds timeout);
  void arbitrate_memory(std::chrono::steady_clock::time_point now);
  // Wants waiting or clients the policies suspended: the coordinator looks often.
  bool memory_policy_busy() const;
  void serve_memory_want(const MemoryWant& want);
  struct IdleClientRef {
    std::uint32_t client = 0;
    std::uint64_t last_record_ns = 0;
  };
  // Below-normal clients idle for --preemption-idle-ms that hold memory, least recently active
  // first.
  std::vector<IdleClientRef> idle_below_normal_clients();
  void resume_what_fits();
  // Under --memory-overcommit: why a client with memory limit `limit` (0: none) is not admitted,
  // or empty. With `changing_pid`, why that running client's limit may not be raised to `limit`
  // (its present limit not counted; lowering is always allowed), refused too when a worker does
  // not answer within `timeout`.
  std::string overcommit_refusal(std::uint64_t limit, int changing_pid = 0,
                                 std::chrono::milliseconds timeout = std::chrono::minutes(5));

  // loop.cpp: the coordinator's memory upkeep at each look: the primary context's lease, kept
  // library images past their idle timeout (image_cache.hpp), the heap trim.
  void look_after_memory(std::chrono::steady_clock::time_point now);

  // admit.cpp
  void refuse(int client_fd, CUresult error, const std::string& message);
  // The shared memory account of allocation `id` (made on its first client).
  std::shared_ptr<AllocationAccount> allocation_account(std::uint32_t id, std::uint64_t limit);

  Gpu gpu_;
  ServerSettings settings_;
  // Before the lease (which empties it) and the workers (whose sessions give back to it).
  GreenContextPool green_pool_{gpu_, settings_.green_context_pool};
  // The interprocess handles of this server's clients, shared by every worker (its own mutex;
  // ipc_registry.hpp). Declared before the sessions' owners: it outlives every session.
  IpcRegistry ipc_{gpu_.ordinal};
  // Libraries shared between sessions (image_cache.hpp): outlives every session, which hold them.
  ImageCache images_{settings_.share_images, settings_.image_idle_timeout};
  // Host memory kept for parking (park_pool.hpp; --park-pool): filled and drained with the lease.
  ParkPool park_pool_{*gpu_.cu, settings_.park_pool};
  ContextLease lease_{gpu_, green_pool_, settings_.context_idle_timeout,
                      settings_.park_pool != 0 ? &park_pool_ : nullptr};
  proto::UniqueFd control_;
  proto::UniqueFd epoll_;
  proto::UniqueFd wake_;  // eventfd: a worker wants the coordinator to look (fault, drained)
  std::vector<std::unique_ptr<Worker>> workers_;
  std::uint32_t next_client_id_ = 1;
  // Allocations with a client here, by id; the sessions hold them, this only finds them.
  std::unordered_map<std::uint32_t, std::weak_ptr<AllocationAccount>> allocations_;
  std::chrono::steady_clock::time_point next_io_poll_{};
  bool stopping_ = false;
  std::atomic<CUresult> fault_{CUDA_SUCCESS};
  // Written once, by raise_fault's winner, then published by fault_culprit_ready_ (release).
  FaultCulprit fault_culprit_;
  std::atomic<bool> fault_culprit_ready_{false};
  std::atomic<std::size_t> workers_stored_fault_{0};
  std::atomic<std::size_t> workers_failed_{0};
  std::function<void(int)> fatal_;
  PriorityBoard priority_board_;
  HeapTrimmer heap_trimmer_;  // session_freed() from any worker; trims on the coordinator
  std::atomic<std::size_t> placed_sessions_{0};      // session_placed() - session_freed()
  const std::size_t cpus_ = default_worker_count();  // CPUs it may run on, for crowded_level()
  SmReserve sm_reserve_;                             // written by the constructor only
  // The memory policies (memory_arbiter.hpp); null when both are off. Wants from any worker;
  // the rest the coordinator's.
  std::unique_ptr<MemoryArbiter> memory_arbiter_;
  std::chrono::steady_clock::time_point next_resume_look_{};
  std::chrono::steady_clock::time_point last_preemption_{};
};

}  // namespace mpsshim::server

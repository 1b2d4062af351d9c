// A server worker: one thread that owns a shard of the client sessions and everything in them
// (ring, handle tables, streams, owed completions, retired objects) and is the only thread that
// touches them. Its pass drains each owned ring (a bounded batch per session, round-robin, so
// one client cannot starve another on the same worker), polls the GPU work answers are owed
// for, and frees departed sessions once their work drained. Nothing on this path takes a lock
// shared with another worker: launches of sessions on different workers reach the driver in
// parallel.
//
// Everything else reaches a worker through its mailbox (new sessions, operator requests,
// shutdown), a mutex-guarded queue that the pass looks at only when a flag says it holds mail.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "broker/server/core/idle_strategy.hpp"
#include "broker/server/session/session.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

class Server;

class Worker final : public Parker {
 public:
  using Task = std::function<void(Worker&)>;

  Worker(Server& server, std::size_t index);
  ~Worker() override;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // ---- the worker's own thread (or the test's thread in inline mode) ---------------------
  // One pass; returns the amount of work done (0 = idle).
  std::size_t do_work();
  void park(std::chrono::nanoseconds timeout, std::chrono::nanoseconds poll_nap) override;
  bool doze(std::chrono::nanoseconds timeout) override;
  // What the sessions' owed GPU work needs of the idle loop (fence_watch.hpp).
  GpuWait gpu_wait() const;

  // Stops reading the client's ring; its GPU work drains, then everything it owned is freed.
  // notify != CUDA_SUCCESS is stored as the session's fault and answers everything owed.
  void end_session(Session& session, const std::string& reason, CUresult notify);
  // After a sticky fault anywhere in the server: every owned session gets the fault and every
  // answer it is owed; normal passes stop. Harmless to repeat (a session placed late).
  void fail_sessions(CUresult error);
  const std::vector<std::unique_ptr<Session>>& sessions() const { return sessions_; }
  Session* find_session(std::uint32_t client_id) const;

  // ---- any thread --------------------------------------------------------------------------
  // Hands a new session to this worker; it starts serving it at its next pass (inline mode:
  // at once).
  void adopt(std::unique_ptr<Session> session);
  // Runs `task` on the worker's thread at its next pass.
  void post(Task task);
  // Wakes the worker from park (a fault to spread, a stop).
  void nudge();
  // Sessions owned or on their way (placement and `finished`).
  std::size_t load() const { return load_.load(std::memory_order_acquire); }
  std::size_t index() const { return index_; }

  // Starts the thread (primary context current, signals blocked) running passes under `idle`
  // until stop(), its timed sleeps at most `timer_slack` late (timer_slack.hpp; nullopt: the
  // server's); without start() the server runs passes inline (tests).
  void start(std::unique_ptr<IdleStrategy> idle,
             std::optional<std::chrono::nanoseconds> timer_slack = std::nullopt);
  void stop();  // joins
  // Set before the thread starts and cleared after it was joined: the worker's own thread and
  // the coordinator may both ask (thread_ itself is the coordinator's).
  bool threaded() const { return threaded_.load(std::memory_order_acquire); }

 private:
  // epoll_event.data.u64: client id << 2 | source.
  enum Source : std::uint64_t { kMailbox = 0, kSocket = 1, kDoorbell = 2 };

  void loop(std::unique_ptr<IdleStrategy> idle,
            std::optional<std::chrono::nanoseconds> timer_slack);
  std::size_t take_mail();
  void serve(std::unique_ptr<Session> session);
  // Stores Server::crowded_level() in every session's control block when it changed.
  void tell_crowded();
  std::size_t drain_ring(Session& session);
  std::size_t poll_gpu();
  std::size_t reap();
  std::size_t poll_io(std::chrono::nanoseconds timeout);
  void on_event(const epoll_event& event);
  void watch(int fd, std::uint64_t tag);
  void unwatch(int fd);
  void free_session(Session& session);
  // A sticky error in `culprit`'s work: the server learns of it, then this worker's sessions
  // fail (reply_slot: the culprit's record that returned it, answered after its fault is set).
  void sticky_fault(Session& culprit, CUresult error, proto::Op op,
                    std::uint32_t reply_slot = proto::kNoReply);

  Server& server_;
  const std::size_t index_;
  proto::UniqueFd epoll_;
  proto::UniqueFd wake_;  // eventfd: mail arrived

  // Owned by the worker's thread.
  std::vector<std::unique_ptr<Session>> sessions_;
  std::size_t round_robin_ = 0;
  std::chrono::steady_clock::time_point next_io_poll_{};
  bool failed_ = false;                   // fail_sessions ran
  std::uint64_t context_generation_ = 0;  // Gpu::primary_generation this thread has current
  std::uint32_t crowded_level_told_ = 0;  // what tell_crowded() last stored in the sessions
  bool crowded_told_ = false;             // crowded_level_told_ != 0
  // The culprit's call that returned the sticky error: answered by fail_sessions once every
  // worker's sessions hold the fault.
  struct FaultReply {
    Session* session = nullptr;
    std::uint32_t slot = proto::kNoReply;
    CUresult error = CUDA_SUCCESS;
  };
  FaultReply pending_fault_reply_;

  // The mailbox: written by any thread, emptied by the worker.
  std::mutex mail_mutex_;
  std::vector<std::unique_ptr<Session>> arrivals_;
  std::vector<Task> tasks_;
  std::atomic<bool> has_mail_{false};
  std::atomic<std::size_t> load_{0};

  std::thread thread_;
  std::atomic<bool> exit_{false};
  std::atomic<bool> threaded_{false};
};

}  // namespace mpsshim::server

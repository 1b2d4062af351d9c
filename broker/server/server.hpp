// mpsshim-server's single-threaded agent: one per GPU. do_work() makes one pass over the
// control socket, every client's request ring (a bounded batch each, round-robin, so one
// client cannot starve another), and the GPU work answers are owed for; it returns how much it
// did, and an IdleStrategy decides what to do when that was nothing.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "broker/server/gpu.hpp"
#include "broker/server/idle_strategy.hpp"
#include "broker/server/session.hpp"
#include "proto/control.hpp"
#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

struct ServerSettings {
  int default_sm_percentage = 100;  // for clients that set no CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
  std::uint64_t default_memory_limit = 0;  // for clients that set no limit; 0 = none
  proto::SegmentGeometry geometry{};
  std::size_t batch_per_client = 32;  // records per client per pass
};

// The process exit code after a sticky GPU fault: the daemon starts a fresh server.
inline constexpr int kExitGpuFault = 70;

class Server final : public Parker {
 public:
  Server(Gpu gpu, ServerSettings settings, proto::UniqueFd control);
  ~Server() override;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // One pass; returns the amount of work done (0 = idle).
  std::size_t do_work();
  // Passes until the server is finished (control socket closed or `stop`, and every session
  // freed) or a fault. Returns the process exit code.
  int run(IdleStrategy& idle, const std::atomic<bool>& stop);

  void park(std::chrono::nanoseconds timeout) override;
  bool gpu_pending() const;

  // A client connection from the daemon (public for tests).
  void admit(const proto::ServerAdmit& admit, proto::UniqueFd client);
  // Stops reading the client's ring; its GPU work drains, then everything it owned is freed.
  // notify != CUDA_SUCCESS is stored as the session's fault and answers everything owed.
  void end_session(Session& session, const std::string& reason, CUresult notify);
  // Ends every session, then the server finishes.
  void shutdown(const std::string& reason);
  bool finished() const { return stopping_ && sessions_.empty(); }
  bool faulted() const { return faulted_; }

  // What happens after a sticky fault has been reported to every client. Default: exit(70).
  void set_fatal_handler(std::function<void(int)> handler) { fatal_ = std::move(handler); }

  // One line per client, for mpsshimctl ps.
  std::string stats_text() const;
  const Gpu& gpu() const { return gpu_; }
  const ServerSettings& settings() const { return settings_; }
  std::size_t session_count() const { return sessions_.size(); }
  Session* find_session(std::uint32_t client_id) const;

 private:
  // epoll_event.data.u64: client id << 2 | source.
  enum Source : std::uint64_t { kControl = 0, kSocket = 1, kDoorbell = 2 };

  std::size_t drain_ring(Session& session);
  std::size_t poll_gpu();
  std::size_t reap();
  std::size_t poll_io(std::chrono::nanoseconds timeout);
  void on_event(const epoll_event& event);
  void watch(int fd, std::uint64_t tag);
  void unwatch(int fd);

  // control.cpp
  std::size_t read_control();
  void on_control_message(proto::Received& message);
  void reply_text(proto::MessageKind kind, int status, const std::string& text);
  std::string terminate_client(const std::string& text, int& status);
  std::string control_command(const std::string& text, int& status);

  // admit.cpp
  void refuse(int client_fd, CUresult error, const std::string& message);

  // A sticky error: every client's session gets the fault, then everything owed is answered
  // with it (reply_slot: the culprit's record that returned it), then the fatal handler runs.
  void fatal_fault(Session* culprit, CUresult error, proto::Op op,
                   std::uint32_t reply_slot = proto::kNoReply);
  void free_session(Session& session);

  Gpu gpu_;
  ServerSettings settings_;
  proto::UniqueFd control_;
  proto::UniqueFd epoll_;
  std::vector<std::unique_ptr<Session>> sessions_;
  std::uint32_t next_client_id_ = 1;
  std::size_t round_robin_ = 0;
  std::chrono::steady_clock::time_point next_io_poll_{};
  bool stopping_ = false;
  bool faulted_ = false;
  std::function<void(int)> fatal_;
};

}  // namespace mpsshim::server

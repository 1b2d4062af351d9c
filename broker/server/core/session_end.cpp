#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "broker/server/core/server.hpp"
#include "broker/server/ops/dispatch.hpp"
#include "broker/server/session/completions.hpp"
#include "broker/server/session/host_callbacks.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// The program name a client gave (any bytes) as it may appear in other clients' logs, the
// daemon's log and ps: control characters could forge lines there.
std::string printable(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return out;
}

std::string freed_summary(const FreedTally& t) {
  std::vector<std::string> parts;
  auto count = [](std::size_t n, const char* one, const char* many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
  };
  if (t.allocations != 0) {
    parts.push_back(fmt::format("{} ({})", count(t.allocations, "allocation", "allocations"),
                                format_bytes(t.allocation_bytes)));
  }
  if (t.physical_allocations != 0) {
    parts.push_back(fmt::format(
        "{} ({})", count(t.physical_allocations, "physical allocation", "physical allocations"),
        format_bytes(t.physical_bytes)));
  }
  if (t.mappings != 0) parts.push_back(count(t.mappings, "mapping", "mappings"));
  if (t.reservations != 0) {
    parts.push_back(count(t.reservations, "address reservation", "address reservations"));
  }
  if (t.modules != 0) parts.push_back(count(t.modules, "module", "modules"));
  if (t.libraries != 0) parts.push_back(count(t.libraries, "library", "libraries"));
  if (t.streams != 0) parts.push_back(count(t.streams, "stream", "streams"));
  if (t.events != 0) parts.push_back(count(t.events, "event", "events"));
  if (t.graphs != 0) parts.push_back(count(t.graphs, "graph", "graphs"));
  if (t.regions != 0)
    parts.push_back(count(t.regions, "pinned host region", "pinned host regions"));
  if (t.arrays != 0) parts.push_back(count(t.arrays, "CUDA array", "CUDA arrays"));
  if (t.textures != 0) {
    parts.push_back(count(t.textures, "texture/surface object", "texture/surface objects"));
  }
  if (parts.empty()) return "nothing to free";
  return "freed " + fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

void Worker::end_session(Session& session, const std::string& reason, CUresult notify) {
  if (session.life.state != SessionState::kActive) return;
  session.life.state = SessionState::kDraining;
  session.life.end_reason = reason;
  session.life.end_notify = notify;
  session.life.drain_started = std::chrono::steady_clock::now();
  // Host functions waiting for the client return now, so its streams can drain.
  if (session.callbacks) session.callbacks->end();
  if (notify != CUDA_SUCCESS) {
    // The client may still be alive (terminated, or it broke the protocol): every later call
    // and every call now waiting returns this.
    session.control()->fault.store(static_cast<std::uint32_t>(notify), std::memory_order_seq_cst);
    abandon_completions(session, notify);
    session.wake_everyone();
  }
  if (notify != CUDA_SUCCESS) log_warn("{} {}; ending its session", session.who(), reason);
  if (session.socket) {
    unwatch(session.socket.get());
    // shutdown, not just close: the daemon may still hold a copy of this socket.
    ::shutdown(session.socket.get(), SHUT_RDWR);
    session.socket.reset();
  }
  if (session.doorbell) {
    unwatch(session.doorbell.get());
    session.doorbell.reset();
  }
  session.stash.clear();
}

void Worker::free_session(Session& session) {
  priority_leave(session, server_.priority_board());
  // The below-normal sessions get the SMs reserved for normal ones back once none is left.
  if (!session.priority.below_normal && server_.sm_reserve().on()) server_.nudge_workers();
  FreedTally tally = free_everything(session);
  if (session.life.end_notify == CUDA_SUCCESS) {  // the client left: "disconnected", "said goodbye"
    log_info("{} {}; {}", session.who(), session.life.end_reason, freed_summary(tally));
  } else {
    log_info("{}: session over ({}); {}", session.who(), session.life.end_reason,
             freed_summary(tally));
  }
}

void Worker::sticky_fault(Session& culprit, CUresult error, proto::Op op,
                          std::uint32_t reply_slot) {
  server_.raise_fault(&culprit, error, op);
  // The culprit's own call is answered once every session holds the fault, so the client
  // never sees the error as its call's alone.
  pending_fault_reply_ = {&culprit, reply_slot, error};
  fail_sessions(server_.fault());
}

void Worker::fail_sessions(CUresult error) {
  const bool first = !failed_;
  failed_ = true;
  // Every session holds the fault before anything owed is answered with it, and learns whose
  // work returned it first (published by the store of `fault`).
  const Server::FaultCulprit& culprit = server_.fault_culprit();
  for (auto& s : sessions_) {
    proto::SessionControl* control = s->control();
    control->fault_pid = static_cast<std::uint32_t>(culprit.pid);
    const std::size_t n = std::min(culprit.program.size(), sizeof control->fault_program - 1);
    std::memcpy(control->fault_program, culprit.program.data(), n);
    control->fault_program[n] = '\0';
    control->fault.store(static_cast<std::uint32_t>(error), std::memory_order_seq_cst);
  }
  if (first) server_.worker_stored_fault();
  // ... on every worker: a client answered with the fault may tell another client (a parent
  // and its workers), who must then find it set too. Every worker stores before it waits, so
  // the wait ends unless a worker is stuck in the driver (bounded).
  if (threaded()) server_.await_fault_stored();
  if (pending_fault_reply_.session != nullptr) {
    if (pending_fault_reply_.slot != proto::kNoReply) {
      pending_fault_reply_.session->answer(pending_fault_reply_.slot, pending_fault_reply_.error);
    }
    pending_fault_reply_ = {};
  }
  for (auto& s : sessions_) {
    abandon_completions(*s, error);
    s->wake_everyone();
  }
  if (first) server_.worker_failed_sessions();
}

void Server::shutdown(const std::string& reason) {
  if (stopping_) return;
  stopping_ = true;
  log_info("shutting down ({}); ending {} session(s)", reason, session_count());
  for (auto& worker : workers_) {
    worker->post([](Worker& w) {
      for (const auto& s : w.sessions())
        w.end_session(*s, "was disconnected: the server is shutting down",
                      CUDA_ERROR_MPS_CONNECTION_FAILED);
    });
  }
}

bool Server::raise_fault(const Session* culprit, CUresult error, proto::Op op) {
  CUresult none = CUDA_SUCCESS;
  if (!fault_.compare_exchange_strong(none, error, std::memory_order_acq_rel)) return false;
  // Only the winner writes the culprit, at once: a worker that saw the fault first waits for
  // these few stores in fault_culprit().
  if (culprit != nullptr) {
    fault_culprit_.client = culprit->client.id;
    fault_culprit_.pid = culprit->client.pid;
    fault_culprit_.uid = culprit->client.uid;
    fault_culprit_.program = printable(culprit->client.program);
    fault_culprit_.op = op == proto::Op::kPad ? "queued" : op_name(op);
  }
  fault_culprit_.clients = session_count();
  fault_culprit_ready_.store(true, std::memory_order_release);
  std::string error_text = describe(*gpu_.cu, error);
  if (culprit != nullptr) {
    log_error(
        "GPU fault: {} work of {} failed with {}. A fault poisons every context of this "
        "process, so all {} client(s) get this error and the server exits for a fresh one",
        op == proto::Op::kPad ? "queued" : op_name(op), culprit->who(), error_text,
        session_count());
  } else {
    log_error("GPU fault: {}; all {} client(s) get this error and the server exits for a fresh one",
              error_text, session_count());
  }
  for (auto& worker : workers_) worker->nudge();
  wake();
  return true;
}

const Server::FaultCulprit& Server::fault_culprit() const {
  static const FaultCulprit kUnknown{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (!fault_culprit_ready_.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() >= deadline) return kUnknown;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return fault_culprit_;
}

void Server::worker_stored_fault() {
  workers_stored_fault_.fetch_add(1, std::memory_order_acq_rel);
}

void Server::worker_failed_sessions() {
  workers_failed_.fetch_add(1, std::memory_order_acq_rel);
  wake();
}

bool Server::await_fault_stored(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (workers_stored_fault_.load(std::memory_order_acquire) < workers_.size()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

}  // namespace mpsshim::server

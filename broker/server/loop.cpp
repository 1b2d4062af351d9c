#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <ctime>

#include "broker/server/client_socket.hpp"
#include "broker/server/completions.hpp"
#include "broker/server/dispatch.hpp"
#include "broker/server/log.hpp"
#include "broker/server/server.hpp"

namespace mpsshim::server {
namespace {

// While busy, sockets are looked at this often (records arrive through shared memory and
// need no system call; sockets carry only memfds, hang-ups and operator requests).
constexpr auto kIoPollInterval = std::chrono::microseconds(100);

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

Server::Server(Gpu gpu, ServerSettings settings, proto::UniqueFd control)
    : gpu_(gpu),
      settings_(settings),
      control_(std::move(control)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      fatal_([](int code) {
        std::fflush(nullptr);
        // No destructors or atexit handlers: they would call into a poisoned driver.
        std::_Exit(code);
      }) {
  if (control_) {
    set_nonblocking(control_.get());
    watch(control_.get(), kControl);
  }
}

Server::~Server() = default;

void Server::watch(int fd, std::uint64_t tag) {
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.u64 = tag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
    log_error("cannot watch fd {} ({}); that client's hang-up may go unnoticed", fd,
              std::strerror(errno));
  }
}

void Server::unwatch(int fd) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

Session* Server::find_session(std::uint32_t client_id) const {
  for (const auto& s : sessions_) {
    if (s->client.id == client_id) return s.get();
  }
  return nullptr;
}

std::size_t Server::do_work() {
  if (faulted_) return 0;
  std::size_t work = 0;
  auto now = std::chrono::steady_clock::now();
  if (now >= next_io_poll_) {
    next_io_poll_ = now + kIoPollInterval;
    work += poll_io(std::chrono::nanoseconds(0));
  }
  if (!sessions_.empty()) {
    std::size_t n = sessions_.size();
    std::size_t start = round_robin_++ % n;
    for (std::size_t k = 0; k < n && !faulted_; ++k) {
      Session& session = *sessions_[(start + k) % n];
      if (session.state == SessionState::kActive) work += drain_ring(session);
    }
  }
  if (!faulted_) work += poll_gpu();
  if (!faulted_) work += reap();
  return work;
}

std::size_t Server::drain_ring(Session& session) {
  std::size_t done = 0;
  while (done < settings_.batch_per_client) {
    proto::Peeked peeked = session.ring.peek();
    if (peeked.status == proto::PeekStatus::kEmpty) break;
    if (peeked.status == proto::PeekStatus::kMalformed) {
      end_session(session, "corrupted its request ring", CUDA_ERROR_MPS_RPC_FAILURE);
      break;
    }
    DispatchOutcome outcome = dispatch_record(session, peeked.record);
    if (session.ring.release()) session.ring.wake_producer();
    ++done;
    if (outcome.kind == DispatchOutcome::Kind::kSticky) {
      fatal_fault(&session, outcome.sticky, outcome.op, outcome.reply_slot);
      break;
    }
    if (outcome.kind == DispatchOutcome::Kind::kEndSession) {
      end_session(session, outcome.why, outcome.notify);
      break;
    }
  }
  return done;
}

std::size_t Server::poll_gpu() {
  std::size_t work = 0;
  for (std::size_t i = 0; i < sessions_.size() && !faulted_;) {
    Session& session = *sessions_[i];
    for (PollOutcome outcome : {poll_completions(session), poll_retired(session)}) {
      work += outcome.fired;
      if (outcome.sticky != CUDA_SUCCESS && !faulted_) {
        fatal_fault(&session, outcome.sticky, outcome.sticky_op);
      }
    }
    if (faulted_) break;
    if (session.state != SessionState::kDraining) {
      ++i;
      continue;
    }
    // A departed client's queued work runs to its end before its memory is freed.
    bool idle = true;
    for (std::uint64_t id : session.objects.ids<StreamObj>()) {
      CUresult r = session.cu().cuStreamQuery(session.objects.get<StreamObj>(id)->stream);
      if (r == CUDA_ERROR_NOT_READY) {
        idle = false;
        break;
      }
      if (is_sticky(r, true)) {
        fatal_fault(&session, r, proto::Op::kPad);
        return work;
      }
    }
    if (!idle) {
      auto waited = std::chrono::steady_clock::now() - session.drain_started;
      if (!session.drain_warned && waited > std::chrono::seconds(10)) {
        session.drain_warned = true;
        log_warn(
            "{} is gone but its GPU work is still running after 10 s; what it owned is "
            "freed when that work ends",
            session.who());
      }
      ++i;
      continue;
    }
    free_session(session);
    sessions_.erase(sessions_.begin() + static_cast<std::ptrdiff_t>(i));
    ++work;
  }
  return work;
}

std::size_t Server::reap() {
  std::size_t work = 0;
  for (auto& s : sessions_) {
    if (s->state == SessionState::kActive && !s->end_requested.empty()) {
      end_session(*s, s->end_requested, s->end_notify);
      ++work;
    }
  }
  return work;
}

bool Server::gpu_pending() const {
  for (const auto& s : sessions_) {
    if (s->state == SessionState::kDraining || s->pending_gpu_work() != 0) return true;
  }
  return false;
}

std::size_t Server::poll_io(std::chrono::nanoseconds timeout) {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  int n;
  if (timeout.count() < 0) {
    n = ::epoll_wait(epoll_.get(), events, kMaxEvents, -1);
  } else {
    timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
                static_cast<long>(timeout.count() % 1'000'000'000)};
    n = ::epoll_pwait2(epoll_.get(), events, kMaxEvents, &ts, nullptr);
    if (n < 0 && errno == ENOSYS) {  // kernels before 5.11: millisecond steps, rounded up
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
      n = ::epoll_wait(epoll_.get(), events, kMaxEvents, static_cast<int>(ms));
    }
  }
  if (n <= 0) return 0;
  for (int i = 0; i < n; ++i) on_event(events[i]);
  return static_cast<std::size_t>(n);
}

void Server::on_event(const epoll_event& event) {
  const std::uint64_t tag = event.data.u64;
  if (tag == kControl) {
    read_control();
    return;
  }
  Session* session = find_session(static_cast<std::uint32_t>(tag >> 2));
  if (session == nullptr || session->state != SessionState::kActive) return;
  if ((tag & 3) == kDoorbell) {
    std::uint64_t rings = 0;
    [[maybe_unused]] ssize_t n = ::read(session->doorbell.get(), &rings, sizeof rings);
  } else {
    pump_client_socket(*session);
  }
}

void Server::park(std::chrono::nanoseconds timeout) {
  // Announce the sleep in every ring, then look once more: a record committed before a
  // client saw the flag rings no doorbell.
  bool ready = false;
  for (auto& s : sessions_) {
    if (s->state == SessionState::kActive) s->ring.prepare_sleep();
  }
  // Pairs with the fence in RingProducer::commit: either the client sees the flag and rings,
  // or the re-check below sees its record.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (auto& s : sessions_) {
    if (s->state != SessionState::kActive) continue;
    if (s->ring.peek().status != proto::PeekStatus::kEmpty) ready = true;
  }
  if (!ready) {
    poll_io(timeout);
    next_io_poll_ = std::chrono::steady_clock::now() + kIoPollInterval;
  }
  for (auto& s : sessions_) {
    if (s->state == SessionState::kActive) s->ring.end_sleep();
  }
}

int Server::run(IdleStrategy& idle, const std::atomic<bool>& stop) {
  while (!finished()) {
    if (stop.load(std::memory_order_relaxed) && !stopping_) shutdown("asked to stop");
    std::size_t work = do_work();
    if (faulted_) return kExitGpuFault;
    idle.idle(work, gpu_pending(), *this);
  }
  return 0;
}

}  // namespace mpsshim::server

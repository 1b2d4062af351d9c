#include "broker/server/core/worker.hpp"
#include "broker/server/session/busy_time.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "broker/server/core/server.hpp"
#include "broker/server/core/timer_slack.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/ops/dispatch.hpp"
#include "broker/server/scheduling/priority_reserve.hpp"
#include "broker/server/session/client_socket.hpp"
#include "broker/server/session/completions.hpp"
#include "broker/server/session/fence_watch.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/sm_quota_change.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// While busy, sockets are looked at this often (records arrive through shared memory and
// need no system call; sockets carry only memfds and hang-ups).
constexpr auto kIoPollInterval = std::chrono::microseconds(100);

}  // namespace

Worker::Worker(Server& server, std::size_t index)
    : server_(server),
      index_(index),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!epoll_ || !wake_) {
    log_error("worker {}: epoll/eventfd failed ({}); it will only poll", index,
              std::strerror(errno));
  }
  if (wake_) watch(wake_.get(), kMailbox);
}

Worker::~Worker() {
  stop();
}

void Worker::watch(int fd, std::uint64_t tag) {
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.u64 = tag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
    log_error("cannot watch fd {} ({}); that client's hang-up may go unnoticed", fd,
              std::strerror(errno));
  }
}

void Worker::unwatch(int fd) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

// ---- the mailbox ------------------------------------------------------------------------

void Worker::adopt(std::unique_ptr<Session> session) {
  load_.fetch_add(1, std::memory_order_acq_rel);
  server_.session_placed();
  if (!threaded()) {
    // Inline mode: the caller runs this worker's passes, so it may serve the session itself,
    // as a single-threaded server would.
    serve(std::move(session));
    return;
  }
  {
    std::lock_guard lock(mail_mutex_);
    arrivals_.push_back(std::move(session));
    has_mail_.store(true, std::memory_order_release);
  }
  nudge();
}

void Worker::nudge() {
  std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void Worker::post(Task task) {
  {
    std::lock_guard lock(mail_mutex_);
    tasks_.push_back(std::move(task));
    has_mail_.store(true, std::memory_order_release);
  }
  nudge();
}

std::size_t Worker::take_mail() {
  // The common pass finds no mail and takes no lock.
  if (!has_mail_.load(std::memory_order_acquire)) return 0;
  std::vector<std::unique_ptr<Session>> arrivals;
  std::vector<Task> tasks;
  {
    std::lock_guard lock(mail_mutex_);
    arrivals.swap(arrivals_);
    tasks.swap(tasks_);
    has_mail_.store(false, std::memory_order_release);
  }
  for (auto& session : arrivals) serve(std::move(session));
  for (Task& task : tasks) task(*this);
  return arrivals.size() + tasks.size();
}

void Worker::serve(std::unique_ptr<Session> session) {
  Session& s = *session;
  sessions_.push_back(std::move(session));
  // The coordinator retained the primary context before handing the session over; after an
  // idle release it may be a new one. Everything the worker issues runs with it current.
  if (const Gpu& gpu = server_.gpu(); gpu.primary_generation != context_generation_) {
    if (CUresult r = gpu.cu->cuCtxSetCurrent(gpu.primary); r != CUDA_SUCCESS) {
      log_error("worker {}: cannot make the primary context current: {}", index_,
                describe(*gpu.cu, r));
    }
    context_generation_ = gpu.primary_generation;
  }
  if (server_.faulted()) {  // placed while the fault spread: it fails with the rest
    fail_sessions(server_.fault());
    return;
  }
  // What the worker last told its other sessions; the next pass corrects it if it changed.
  s.control()->crowded.store(crowded_level_told_, std::memory_order_relaxed);
  watch(s.socket.get(), std::uint64_t{s.client.id} << 2 | kSocket);
  watch(s.doorbell.get(), std::uint64_t{s.client.id} << 2 | kDoorbell);
}

Session* Worker::find_session(std::uint32_t client_id) const {
  for (const auto& s : sessions_) {
    if (s->client.id == client_id) return s.get();
  }
  return nullptr;
}

// ---- one pass ---------------------------------------------------------------------------

void Worker::tell_crowded() {
  const std::uint32_t level = server_.crowded_level();
  if (level == crowded_level_told_) return;
  crowded_level_told_ = level;
  crowded_told_ = level != 0;
  for (const auto& s : sessions_) {
    s->control()->crowded.store(level, std::memory_order_relaxed);
  }
}

std::size_t Worker::do_work() {
  std::size_t work = take_mail();
  if (server_.faulted()) {
    if (!failed_) fail_sessions(server_.fault());
    return work;
  }
  tell_crowded();
  auto now = std::chrono::steady_clock::now();
  if (now >= next_io_poll_) {
    next_io_poll_ = now + kIoPollInterval;
    work += poll_io(std::chrono::nanoseconds(0));
  }
  if (!sessions_.empty()) {
    std::size_t n = sessions_.size();
    std::size_t start = round_robin_++ % n;
    for (std::size_t k = 0; k < n && !failed_; ++k) {
      Session& session = *sessions_[(start + k) % n];
      // A suspended session's ring waits (session/suspension.hpp).
      if (session.life.state != SessionState::kActive || session.suspension.on) continue;
      // Before the pass: nothing of the session waits in its launch batch.
      follow_priority_reserve(session, server_.priority_board(), now);
      work += drain_ring(session);
    }
  }
  if (!failed_) work += poll_gpu();
  if (!failed_) work += reap();
  return work;
}

std::size_t Worker::drain_ring(Session& session) {
  std::size_t batch = server_.settings().batch_per_client;
  // The pass's safe point for priorities: nothing of this session waits in a batch now.
  PriorityBoard& board = server_.priority_board();
  bool held_to_limit = false;
  if (session.priority.below_normal) {
    const DrainPermit permit = priority_permit(session, board, server_.settings().priority,
                                               std::chrono::steady_clock::now());
    if (!permit.drain) return 0;
    if (permit.limit != 0) {
      batch = std::min(batch, permit.limit);
      held_to_limit = true;
    }
  } else if (server_.settings().priority.enabled &&
             session.ring.peek().status != proto::PeekStatus::kEmpty) {
    priority_saw_work(session, board);
  }
  // Consecutive launches collect in the session's launch batch (launch_batch.hpp) while this
  // pass finds them in the ring; the batch goes out when something else comes, when it is full,
  // and at the latest when the pass ends. It never waits for records that are not there yet.
  LaunchBatchSettings batching = server_.settings().launch_batch;
  if (!session.launch_batching) batching.max_launches = 0;  // MPSSHIM_LAUNCH_BATCHING=off
  // Crowded, driver calls limit throughput more than one stream's idle time: no ramp.
  if (crowded_told_) batching.ramp_last = 0;
  // Crowded, a host fence's driver call costs more than a synchronize gains (host_fences.hpp).
  session.fences.max_queued =
      crowded_told_ ? server_.settings().crowded_fence_max_queued : UINT64_MAX;
  session.fences.crowded = crowded_told_;
  session.launch_batch.configure(batching);
  std::size_t done = 0;
  DispatchOutcome outcome;
  // Issues the waiting launches; false (and a sticky outcome) when the driver faulted.
  auto flush_batch = [&] {
    CUresult r = flush_launches(session);
    if (r == CUDA_SUCCESS) return true;
    outcome = DispatchOutcome{};
    outcome.kind = DispatchOutcome::Kind::kSticky;
    outcome.sticky = r;
    outcome.op = proto::Op::kLaunchKernel;
    return false;
  };
  for (;;) {
    proto::Peeked peeked = session.ring.peek();
    if (peeked.status == proto::PeekStatus::kEmpty) {
      // The ring ran dry: the waiting launches go out now, and what the client posted while the
      // driver took them (a launch's synchronize, ~3.5 us later) is served in this same pass
      // rather than after the pass's polls (~0.6 us on a launch + synchronize round trip).
      if (!session.launch_batch.pending() || !flush_batch()) break;
      continue;
    }
    if (peeked.status == proto::PeekStatus::kMalformed) {
      outcome = DispatchOutcome{DispatchOutcome::Kind::kEndSession, "corrupted its request ring",
                                CUDA_ERROR_MPS_RPC_FAILURE};
      break;
    }
    // Past the pass's share of records only while a waiting batch may still grow: by at most
    // the batch's maximum, as the batch goes out when full. (The opcode is read from shared
    // memory here; a client that rewrites it only changes where its own pass ends.)
    // A below-normal pass held to its run-ahead does not grow a batch past it.
    if (done >= batch && (held_to_limit || !continues_launch_batch(session, peeked.record))) break;
    // Backpressure, not an error: the client's calls wait as they would on a full driver queue.
    if (in_flight_full(session)) break;
    outcome = dispatch_record(session, peeked.record);
    if (session.ring.release()) session.ring.wake_producer();
    ++done;
    if (outcome.kind != DispatchOutcome::Kind::kOk) break;
  }
  // What the eager path would have issued before this point is issued before the session ends
  // or the fault spreads. After a sticky fault nothing more is worth issuing.
  if (outcome.kind != DispatchOutcome::Kind::kSticky) flush_batch();
  // The pass's work on each stream ends its busy span (busy_time.hpp) and gets its fence.
  if (outcome.kind != DispatchOutcome::Kind::kSticky) {
    close_busy_spans(session);
    priority_end_pass(session, board);
    // A live SM quota change that waited for the client's captures to end (its last end may
    // have come in this pass).
    if (session.quota_changes.pending_percentage != 0 &&
        outcome.kind == DispatchOutcome::Kind::kOk) {
      apply_pending_sm_quota(session);
    }
  }
  if (outcome.kind == DispatchOutcome::Kind::kSticky) {
    sticky_fault(session, outcome.sticky, outcome.op, outcome.reply_slot);
  } else if (outcome.kind == DispatchOutcome::Kind::kEndSession) {
    end_session(session, outcome.why, outcome.notify);
  }
  return done;
}

std::size_t Worker::poll_gpu() {
  std::size_t work = 0;
  for (std::size_t i = 0; i < sessions_.size() && !failed_;) {
    Session& session = *sessions_[i];
    work += poll_busy(session);
    work += priority_poll(session, server_.priority_board(), server_.settings().priority,
                          std::chrono::steady_clock::now());
    for (PollOutcome outcome : {poll_completions(session), poll_retired(session)}) {
      work += outcome.fired;
      if (outcome.sticky != CUDA_SUCCESS && !failed_) {
        sticky_fault(session, outcome.sticky, outcome.sticky_op);
      }
    }
    if (failed_) break;
    if (session.life.state != SessionState::kDraining) {
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
        sticky_fault(session, r, proto::Op::kPad);
        return work;
      }
    }
    if (!idle) {
      auto waited = std::chrono::steady_clock::now() - session.life.drain_started;
      if (!session.life.drain_warned && waited > std::chrono::seconds(10)) {
        session.life.drain_warned = true;
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
    load_.fetch_sub(1, std::memory_order_acq_rel);
    server_.session_freed();  // a stopping server may now be finished; the heap may shrink
    ++work;
  }
  return work;
}

std::size_t Worker::reap() {
  std::size_t work = 0;
  for (auto& s : sessions_) {
    if (s->life.state == SessionState::kActive && !s->life.end_requested.empty()) {
      end_session(*s, s->life.end_requested, s->life.end_notify);
      ++work;
    }
  }
  return work;
}

GpuWait Worker::gpu_wait() const {
  GpuWait wait = GpuWait::kNone;
  const bool held_sessions = server_.priority_board().below_normal_sessions() > 0;
  for (const auto& s : sessions_) {
    if (s->life.state == SessionState::kDraining || !s->retiring.empty() ||
        !s->busy.closed.empty()) {
      return GpuWait::kPolled;
    }
    // A normal session that below-normal ones are held for stops counting as busy only after
    // its linger, which the worker's polls measure (priority_poll).
    if (held_sessions && s->priority.counted_busy) return GpuWait::kPolled;
    for (const Completion& c : s->pending) {
      // A client asleep on its slot watches nothing either, but its answer is not hurried with
      // the long yield: it chose to give up its CPU (a crowded server), and the worker's naps
      // serve it (park). Measured both ways in docs/benchmarks.md (Host CPU).
      if (!watchable(*s, c)) return GpuWait::kPolled;
      wait = GpuWait::kWatched;
    }
  }
  return wait;
}

// ---- sockets and sleeping ------------------------------------------------------------------

std::size_t Worker::poll_io(std::chrono::nanoseconds timeout) {
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

void Worker::on_event(const epoll_event& event) {
  const std::uint64_t tag = event.data.u64;
  if (tag == kMailbox) {
    std::uint64_t count = 0;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &count, sizeof count);
    return;  // the pass takes the mail
  }
  Session* session = find_session(static_cast<std::uint32_t>(tag >> 2));
  if (session == nullptr || session->life.state != SessionState::kActive) return;
  if ((tag & 3) == kDoorbell) {
    std::uint64_t rings = 0;
    [[maybe_unused]] ssize_t n = ::read(session->doorbell.get(), &rings, sizeof rings);
    count_watch_wake(*session);
  } else {
    pump_client_socket(*session);
  }
}

void Worker::park(std::chrono::nanoseconds timeout, std::chrono::nanoseconds poll_nap) {
  // Announce the sleep in every ring, then look once more: a record committed before a
  // client saw the flag rings no doorbell.
  bool ready = has_mail_.load(std::memory_order_acquire) || server_.faulted();
  // Without a limit the sleep may leave owed answers to their clients' watches: name the
  // fences first, so a client that sees the sleep sees its watch (fence_watch.hpp).
  const bool watching = timeout.count() < 0;
  for (auto& s : sessions_) {
    if (watching) post_watches(*s);
    if (s->life.state == SessionState::kActive) s->ring.prepare_sleep();
  }
  // Pairs with the fence in RingProducer::commit: either the client sees the flag and rings,
  // or the re-check below sees its record. The same for a watching client: it rings, or the
  // look below sees its fence landed or its sleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  WatchLook look;
  for (auto& s : sessions_) {
    if (watching) look_at_watches(*s, look);
    if (s->life.state != SessionState::kActive || s->suspension.on || in_flight_at_cap(*s)) {
      continue;
    }
    if (s->ring.peek().status != proto::PeekStatus::kEmpty) ready = true;
  }
  if (look.landed) ready = true;
  if (look.fault_check) {
    const auto due = std::max(*look.fault_check - std::chrono::steady_clock::now(),
                              std::chrono::steady_clock::duration::zero());
    timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(due);
  }
  if (look.must_poll && (timeout.count() < 0 || timeout > poll_nap)) timeout = poll_nap;
  if (!ready) {
    poll_io(timeout);
    next_io_poll_ = std::chrono::steady_clock::now() + kIoPollInterval;
  }
  for (auto& s : sessions_) {
    if (s->life.state == SessionState::kActive) s->ring.end_sleep();
  }
}

bool Worker::doze(std::chrono::nanoseconds timeout) {
  for (auto& s : sessions_) {
    if (s->life.state == SessionState::kActive && !s->rings_when_awaited) return false;
  }
  bool ready = has_mail_.load(std::memory_order_acquire) || server_.faulted();
  for (auto& s : sessions_) {
    if (s->life.state == SessionState::kActive) s->ring.prepare_doze();
  }
  // As in park(): a record committed before its client saw the doze is seen here, and one
  // committed after it rings if its client waits for it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (auto& s : sessions_) {
    if (s->life.state != SessionState::kActive || s->suspension.on || in_flight_at_cap(*s)) {
      continue;
    }
    if (s->ring.peek().status != proto::PeekStatus::kEmpty) ready = true;
  }
  if (!ready) {
    poll_io(timeout);
    next_io_poll_ = std::chrono::steady_clock::now() + kIoPollInterval;
  }
  for (auto& s : sessions_) {
    if (s->life.state != SessionState::kActive) continue;
    s->ring.end_sleep();
    if (!ready) ++s->stats.dozes;
  }
  return true;
}

// ---- the thread -----------------------------------------------------------------------------

void Worker::start(std::unique_ptr<IdleStrategy> idle,
                   std::optional<std::chrono::nanoseconds> timer_slack) {
  if (thread_.joinable()) return;
  exit_.store(false, std::memory_order_relaxed);
  // Signals go to the coordinator (main thread): its epoll_wait returns on SIGTERM.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  threaded_.store(true, std::memory_order_release);
  thread_ = std::thread([this, idle = std::move(idle), timer_slack]() mutable {
    loop(std::move(idle), timer_slack);
  });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void Worker::stop() {
  if (!thread_.joinable()) return;
  exit_.store(true, std::memory_order_release);
  nudge();
  thread_.join();
  threaded_.store(false, std::memory_order_release);
}

void Worker::loop(std::unique_ptr<IdleStrategy> idle,
                  std::optional<std::chrono::nanoseconds> timer_slack) {
  char name[16];
  std::snprintf(name, sizeof name, "mpsshim-w%zu", index_);
  ::pthread_setname_np(::pthread_self(), name);
  const std::chrono::nanoseconds slack = set_thread_timer_slack(timer_slack);
  if (index_ == 0) {
    log_info("workers' timed sleeps end at most {} ns late (timer slack, {})", slack.count(),
             timer_slack ? "MPSSHIM_SERVER_TIMER_SLACK" : "the server's own");
  }
  // The primary context is made current by serve(), once a session arrives.
  while (!exit_.load(std::memory_order_acquire)) {
    std::size_t work = do_work();
    idle->idle(work, gpu_wait(), crowded_told_, *this);
  }
}

}  // namespace mpsshim::server

#include "broker/daemon/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "broker/daemon/server_report.hpp"
#include "broker/daemon/sizes.hpp"
#include "broker/daemon/visible_devices.hpp"
#include "broker/daemon/wire.hpp"

namespace mpsshim::daemon {

namespace {

using namespace std::chrono_literals;
using proto::MessageKind;

// The server's exit status after a sticky GPU fault (EX_SOFTWARE; see describe_wait_status).
constexpr int kExitGpuFault = 70;

std::string seconds_text(Clock::duration d) {
  return fmt::format("{:.1f} s", std::chrono::duration<double>(d).count());
}

}  // namespace

std::string_view state_name(ServerState state) {
  switch (state) {
    case ServerState::kStarting:
      return "starting";
    case ServerState::kRunning:
      return "running";
    case ServerState::kRestarting:
      return "restarting";
    case ServerState::kFailed:
      return "failed";
    case ServerState::kStopping:
      return "stopping";
    case ServerState::kStopped:
      return "stopped";
  }
  return "?";
}

Supervisor::Supervisor(EventLoop& loop, SupervisorConfig config, Events events)
    : loop_(loop), config_(std::move(config)), events_(std::move(events)) {
  servers_.push_back(std::make_unique<Server>());
}

Supervisor::~Supervisor() {
  for (auto& server : servers_) {
    if (server->control) loop_.unwatch(server->control.get());
    if (server->process.pidfd) loop_.unwatch(server->process.pidfd.get());
  }
}

void Supervisor::start() {
  spawn(0);
}

std::string Supervisor::name(const Server& server) const {
  if (server.status.pid > 0) {
    return fmt::format("server for GPU {} (pid {})", server.status.ordinal, server.status.pid);
  }
  return fmt::format("server for GPU {}", server.status.ordinal);
}

std::vector<std::string> Supervisor::server_arguments(int ordinal) const {
  std::vector<std::string> args{"--device", std::to_string(ordinal), "--control-fd", "3"};
  if (config_.driver_path) args.insert(args.end(), {"--driver", *config_.driver_path});
  args.insert(args.end(), {"--log-level", std::string(log_level_name(config_.log_level))});
  if (config_.context_idle_timeout_s) {
    args.insert(args.end(),
                {"--context-idle-timeout", std::to_string(*config_.context_idle_timeout_s)});
  }
  if (config_.server_workers) {
    args.insert(args.end(), {"--workers", std::to_string(*config_.server_workers)});
  }
  if (config_.server_launch_batch) {
    args.insert(args.end(), {"--launch-batch", std::to_string(*config_.server_launch_batch)});
  }
  if (config_.server_launch_batch_ramp) {
    args.insert(args.end(),
                {"--launch-batch-ramp", std::to_string(*config_.server_launch_batch_ramp)});
  }
  if (config_.server_launch_batch_graphs) {
    args.insert(args.end(), {"--launch-batch-graphs", *config_.server_launch_batch_graphs});
  }
  if (config_.server_busy_time) args.insert(args.end(), {"--busy-time", "on"});
  if (!config_.server_host_fences) args.insert(args.end(), {"--host-fences", "off"});
  if (config_.server_crowded_fence_max_queued) {
    args.insert(args.end(), {"--crowded-fence-max-queued",
                             std::to_string(*config_.server_crowded_fence_max_queued)});
  }
  if (!config_.server_share_images) args.insert(args.end(), {"--share-images", "off"});
  if (config_.server_image_idle_timeout_s) {
    args.insert(args.end(),
                {"--image-idle-timeout", std::to_string(*config_.server_image_idle_timeout_s)});
  }
  if (config_.server_spin_clients) {
    args.insert(args.end(), {"--spin-clients", std::to_string(*config_.server_spin_clients)});
  }
  if (config_.server_event_poll_us) {
    args.insert(args.end(), {"--event-poll-us", std::to_string(*config_.server_event_poll_us)});
  }
  for (const std::string& limit : config_.client_limits) {
    args.insert(args.end(), {"--client-limit", limit});
  }
  if (!config_.server_priority_scheduling) {
    args.insert(args.end(), {"--priority-scheduling", "off"});
  }
  if (config_.server_priority_max_hold_us) {
    args.insert(args.end(),
                {"--priority-max-hold-us", std::to_string(*config_.server_priority_max_hold_us)});
  }
  if (config_.server_priority_fence_poll_us) {
    args.insert(args.end(), {"--priority-fence-poll-us",
                             std::to_string(*config_.server_priority_fence_poll_us)});
  }
  if (config_.server_priority_reserve_sms) {
    args.insert(args.end(), {"--priority-reserve-sms", *config_.server_priority_reserve_sms});
  }
  if (config_.server_launch_batch_min) {
    args.insert(args.end(),
                {"--launch-batch-min", std::to_string(*config_.server_launch_batch_min)});
  }
  if (defaults_.sm_percentage) {
    args.insert(args.end(), {"--default-sm-percentage", std::to_string(*defaults_.sm_percentage)});
  }
  if (std::uint64_t limit = defaults_.memory_limit_of(ordinal); limit != 0) {
    args.insert(args.end(), {"--default-memory-limit", std::to_string(limit)});
  }
  return args;
}

void Supervisor::spawn(int ordinal) {
  Server& server = *servers_[ordinal];
  server.status.ordinal = ordinal;
  server.timer = 0;
  proto::UniqueFd ours, theirs;
  if (!proto::seqpacket_pair(ours, theirs)) {
    schedule_restart(
        server, fmt::format("could not be started: socketpair: {}", std::strerror(errno)), true);
    return;
  }
  ::fcntl(ours.get(), F_SETFL, O_NONBLOCK);  // a stuck server must never block the daemon
  std::vector<std::string> args = server_arguments(ordinal);
  auto child =
      spawn_child(SpawnRequest{config_.server_path, args, theirs.get(), config_.output_fd});
  if (!child) {
    log_error("cannot start the server for GPU {}: {}", ordinal, child.error());
    schedule_restart(server, "could not be started: " + child.error(), true);
    return;
  }
  server.process = std::move(*child);
  server.control = std::move(ours);
  server.incarnation += 1;
  server.started = Clock::now();
  server.was_ready = false;
  server.start_failed = false;
  server.status.pid = server.process.pid;
  set_state(server, ServerState::kStarting);
  log_info("started {}", name(server));
  if (log_enabled(LogLevel::kDebug)) {
    log_debug("{} runs: {} {}", name(server), config_.server_path, fmt::join(args, " "));
  }

  std::uint64_t incarnation = server.incarnation;
  loop_.watch(server.control.get(), EPOLLIN, [this, ordinal, incarnation](std::uint32_t) {
    on_control_readable(ordinal, incarnation);
  });
  if (server.process.pidfd) {
    loop_.watch(server.process.pidfd.get(), EPOLLIN,
                [this, ordinal](std::uint32_t) { try_reap(ordinal); });
  }
  server.timer = loop_.after(kReadyTimeout, [this, ordinal, incarnation] {
    Server& s = *servers_[ordinal];
    if (s.incarnation != incarnation || s.status.state != ServerState::kStarting) return;
    s.timer = 0;
    log_error("{} did not report ready within {} s; killing it", name(s),
              std::chrono::seconds(kReadyTimeout).count());
    s.start_failed = true;
    s.status.problem = "did not report ready in time";
    signal_child(s.process, SIGKILL);
  });
}

void Supervisor::on_control_readable(int ordinal, std::uint64_t incarnation) {
  Server& server = *servers_[ordinal];
  if (server.incarnation != incarnation || !server.control) return;
  for (int budget = 64; budget > 0; --budget) {
    int error = proto::receive_message(server.control.get(), scratch_);
    if (error == EAGAIN || error == EWOULDBLOCK) return;
    if (error == 0 && !scratch_.bytes.empty()) {
      on_message(server, scratch_);
      if (!server.control) return;  // the message made us drop this server
      continue;
    }
    if (error == EMSGSIZE) {
      log_warn("{} sent an oversized message; ignored", name(server));
      continue;
    }
    // Hang-up (or a broken socket). Usually the server is exiting and its pidfd says so in a
    // moment; pending requests wait for that, since the exit status says more than the hang-up.
    // One that lives on without its control connection can never be given clients again: kill
    // it, and its exit brings a fresh one.
    loop_.unwatch(server.control.get());
    server.control.reset();
    if (server.process.pid > 0 && !stopping_) {
      loop_.after(kHangupGrace, [this, ordinal, incarnation] {
        Server& s = *servers_[ordinal];
        if (s.incarnation != incarnation || s.process.pid <= 0 || stopping_) return;
        log_warn("{} closed its control connection but did not exit; killing it", name(s));
        fail_pending(s, fmt::format("{} closed its control connection without answering", name(s)));
        signal_child(s.process, SIGKILL);
      });
    }
    return;
  }
}

void Supervisor::on_message(Server& server, const proto::Received& message) {
  auto header = header_of(message);
  if (!header || header->magic != proto::kHelloMagic || header->abi_major != proto::kAbiMajor) {
    log_warn(
        "{} sent a message this daemon cannot read (magic {:#x}, ABI {}.{}; this daemon "
        "speaks {}.{}); is mpsshim-server from the same release as mpsshimd?",
        name(server), header ? header->magic : 0, header ? header->abi_major : 0,
        header ? header->abi_minor : 0, proto::kAbiMajor, proto::kAbiMinor);
    return;
  }
  auto kind = static_cast<MessageKind>(header->kind);
  switch (kind) {
    case MessageKind::kServerReady:
      if (auto ready = decode<proto::ServerReady>(message)) {
        on_ready(server, *ready);
      } else {
        log_warn("{} sent a truncated ServerReady ({} bytes); ignored", name(server),
                 message.bytes.size());
      }
      return;
    case MessageKind::kServerStats:
    case MessageKind::kCtlReply:
      on_answer(server, kind, message);
      return;
    default:
      log_debug("{} sent message kind {}; ignored", name(server), header->kind);
  }
}

void Supervisor::on_ready(Server& server, const proto::ServerReady& ready) {
  if (server.status.state != ServerState::kStarting) {
    log_warn("{} reported ready twice; ignored", name(server));
    return;
  }
  loop_.cancel(server.timer);
  server.timer = 0;
  if (ready.ordinal != server.status.ordinal) {
    log_warn("{} reports ordinal {}; using {}", name(server), ready.ordinal, server.status.ordinal);
  }
  if (ready.status != 0) {
    server.start_failed = true;
    server.status.problem = fmt::format("could not start: {} (CUresult {})",
                                        bounded_string(ready.message), ready.status);
    log_error("{} {}", name(server), server.status.problem);
    // It has nothing to offer; its exit drives the restart logic.
    signal_child(server.process, SIGKILL);
  } else {
    proto::DeviceSnapshot snapshot = ready.snapshot;
    snapshot.name[sizeof snapshot.name - 1] = '\0';
    server.status.snapshot = snapshot;
    server.status.problem.clear();
    server.was_ready = true;
    log_info("GPU {} ready: {} ({}), {} SMs, {}, driver {}; {}", server.status.ordinal,
             snapshot.name, format_gpu_uuid(snapshot.uuid), snapshot.sm_count,
             format_size_approx(snapshot.total_memory),
             format_driver_version(snapshot.driver_version), name(server));
    set_state(server, ServerState::kRunning);
  }
  if (server.status.ordinal == 0 && !gpu_count_known_ && ready.device_count > 0) {
    learn_gpu_count(ready.device_count);
  }
  check_settled();
}

void Supervisor::learn_gpu_count(int count) {
  gpu_count_known_ = true;
  if (static_cast<std::size_t>(count) > kMaxGpus) {
    log_warn("the server for GPU 0 reports {} GPUs; managing the first {}", count, kMaxGpus);
    count = static_cast<int>(kMaxGpus);
  }
  log_info("{} GPU{} found", count, count == 1 ? "" : "s");
  for (int ordinal = 1; ordinal < count; ++ordinal) {
    servers_.push_back(std::make_unique<Server>());
    servers_.back()->status.ordinal = ordinal;
    if (!stopping_) spawn(ordinal);
  }
}

void Supervisor::on_answer(Server& server, MessageKind kind, const proto::Received& message) {
  auto text = decode<proto::TextMessage>(message);
  if (!text) {
    log_warn("{} sent a truncated answer ({} bytes); ignored", name(server), message.bytes.size());
    return;
  }
  // Servers answer in order, so the answer belongs to the oldest request of its kind. Requests
  // of that kind queued before it which already timed out were never answered: forget them.
  auto& pending = server.pending;
  auto match = std::find_if(pending.begin(), pending.end(),
                            [kind](const PendingAnswer& p) { return p.expected == kind; });
  if (match == pending.end()) {
    log_warn("{} answered a request nobody made (message kind {}); ignored", name(server),
             static_cast<std::uint32_t>(kind));
    return;
  }
  if (!match->parts.add(*text)) return;  // more parts of this answer follow
  const std::int32_t status = match->parts.status();
  std::string answer = match->parts.text();
  std::uint64_t id = match->id;
  pending.erase(match);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;  // it timed out; the answer came too late
  std::erase_if(pending, [this, kind, id](const PendingAnswer& p) {
    return p.expected == kind && p.id < id && !requests_.contains(p.id);
  });
  AnswerHandler handler = std::move(it->second.handler);
  loop_.cancel(it->second.timer);
  requests_.erase(it);
  handler(ServerAnswer{status, std::move(answer)});
}

void Supervisor::try_reap(int ordinal) {
  Server& server = *servers_[ordinal];
  if (server.process.pid <= 0) return;
  int status = 0;
  pid_t pid;
  do {
    pid = ::waitpid(server.process.pid, &status, WNOHANG);
  } while (pid < 0 && errno == EINTR);
  if (pid == 0) return;  // still running
  if (pid < 0) status = -1;
  on_exit(server, status);
}

void Supervisor::reap() {
  for (std::size_t i = 0; i < servers_.size(); ++i) try_reap(static_cast<int>(i));
}

void Supervisor::on_exit(Server& server, int wait_status) {
  std::string what =
      wait_status == -1 ? "ended (exit status unknown)" : describe_wait_status(wait_status);
  std::string who = name(server);
  if (wait_status != -1 && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kExitGpuFault) {
    server.status.gpu_faults += 1;
  }
  ChildProcess gone = std::exchange(server.process, ChildProcess{});  // nothing left to signal
  if (gone.pidfd) loop_.unwatch(gone.pidfd.get());
  // What it said before dying (typically a failed ServerReady and why) may still be queued.
  if (server.control) on_control_readable(server.status.ordinal, server.incarnation);
  if (server.control) loop_.unwatch(server.control.get());
  server.control.reset();
  server.status.pid = 0;
  loop_.cancel(server.timer);
  server.timer = 0;
  fail_pending(server, fmt::format("{} {} before answering", who, what));

  if (stopping_) {
    log_info("{} {}", who, what);
    set_state(server, ServerState::kStopped);
    if (std::all_of(servers_.begin(), servers_.end(),
                    [](auto& s) { return s->process.pid <= 0; })) {
      finish_stop();
    }
    return;
  }
  Clock::duration uptime = Clock::now() - server.started;
  bool fast = server.start_failed || !server.was_ready || uptime < kStableUptime;
  if (server.start_failed) {
    what = fmt::format("{} after it {}", what, server.status.problem);
  } else if (fast) {
    what = fmt::format("{} {} after it started", what, seconds_text(uptime));
  }
  schedule_restart(server, fmt::format("{} {}", who, what), fast);
}

void Supervisor::schedule_restart(Server& server, std::string_view what_happened, bool fast) {
  server.status.problem = std::string(what_happened);
  server.fast_failures = fast ? server.fast_failures + 1 : 0;
  if (fast && server.fast_failures >= config_.restart_limit) {
    log_error(
        "{}; {} failed starts in a row: giving up on GPU {} (its clients get "
        "CUDA_ERROR_MPS_SERVER_NOT_READY). Fix the cause, then restart mpsshimd",
        what_happened, server.fast_failures, server.status.ordinal);
    set_state(server, ServerState::kFailed);
    check_settled();
    return;
  }
  auto delay = kFirstBackoff;
  for (int i = 1; i < server.fast_failures && delay < kMaxBackoff; ++i) delay *= 2;
  delay = std::min<std::chrono::milliseconds>(delay, kMaxBackoff);
  log_warn("{}; restarting in {}", what_happened, seconds_text(delay));
  set_state(server, ServerState::kRestarting);
  int ordinal = server.status.ordinal;
  server.timer = loop_.after(delay, [this, ordinal] {
    Server& s = *servers_[ordinal];
    s.timer = 0;
    if (stopping_ || s.status.state != ServerState::kRestarting) return;
    s.status.restarts += 1;
    spawn(ordinal);
  });
}

std::optional<std::string> Supervisor::unavailable(const Server& server) const {
  if (server.status.state == ServerState::kRunning && server.control) return std::nullopt;
  if (server.status.state == ServerState::kRunning) {
    return fmt::format("{} has closed its control connection", name(server));
  }
  return fmt::format("the server for GPU {} is {}{}{}", server.status.ordinal,
                     state_name(server.status.state), server.status.problem.empty() ? "" : ": ",
                     server.status.problem);
}

tl::expected<pid_t, std::string> Supervisor::admit(
    int ordinal, int client_fd, const proto::PeerCredentials& peer, const proto::ClientHello& hello,
    std::uint32_t allocation_id, std::uint64_t allocation_memory_limit, std::uint32_t sm_slot,
    std::uint32_t sm_slots, const SmPartition* partition) {
  Server& server = *servers_.at(ordinal);
  if (auto why = unavailable(server)) {
    return tl::unexpected(*why + "; see `mpsshimctl server_list`");
  }
  proto::ServerAdmit admit{};
  admit.header = proto::make_header(MessageKind::kServerAdmit, sizeof admit);
  admit.peer_pid = peer.pid;
  admit.peer_uid = peer.uid;
  admit.peer_gid = peer.gid;
  admit.hello = hello;
  admit.allocation_id = allocation_id;
  admit.allocation_memory_limit = allocation_memory_limit;
  admit.allocation_sm_slot = sm_slot;
  admit.allocation_sm_slots = sm_slots;
  if (partition != nullptr) {
    admit.sm_partition = partition->id;
    admit.partition_first_group = partition->first_group;
    admit.partition_groups = partition->groups;
  }
  int error = proto::send_struct(server.control.get(), admit, std::span<const int>(&client_fd, 1));
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return tl::unexpected(
        fmt::format("{} is not taking new clients fast enough; try again", name(server)));
  }
  if (error != 0) {
    return tl::unexpected(fmt::format("cannot reach {}: {}", name(server), std::strerror(error)));
  }
  return server.status.pid;
}

void Supervisor::request(int ordinal, MessageKind kind, std::string_view text,
                         std::chrono::milliseconds timeout, AnswerHandler handler) {
  Server& server = *servers_.at(ordinal);
  if (auto why = unavailable(server)) {
    handler(tl::unexpected(*why));
    return;
  }
  if (server.pending.size() >= kMaxPendingRequests) {
    handler(tl::unexpected(fmt::format("{} has {} unanswered requests; not sending more",
                                       name(server), server.pending.size())));
    return;
  }
  proto::TextMessage message = make_text(kind, 0, text);
  if (int error = proto::send_struct(server.control.get(), message); error != 0) {
    handler(tl::unexpected(fmt::format("cannot reach {}: {}", name(server), std::strerror(error))));
    return;
  }
  std::uint64_t id = next_request_++;
  MessageKind expected =
      kind == MessageKind::kServerStatsQuery ? MessageKind::kServerStats : MessageKind::kCtlReply;
  server.pending.push_back(PendingAnswer{id, expected, {}});
  EventLoop::TimerId timer = loop_.after(timeout, [this, id] { expire_request(id); });
  requests_.emplace(id, Request{std::move(handler), timer, ordinal, server.status.pid, timeout});
}

void Supervisor::expire_request(std::uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request request = std::move(it->second);
  requests_.erase(it);
  // Its PendingAnswer stays queued so that a late answer is matched to it, not to the next one.
  request.handler(
      tl::unexpected(fmt::format("the server for GPU {} (pid {}) did not answer within {}",
                                 request.ordinal, request.pid, seconds_text(request.timeout))));
}

void Supervisor::fail_pending(Server& server, const std::string& why) {
  std::vector<AnswerHandler> handlers;
  for (const PendingAnswer& pending : server.pending) {
    auto it = requests_.find(pending.id);
    if (it == requests_.end()) continue;
    loop_.cancel(it->second.timer);
    handlers.push_back(std::move(it->second.handler));
    requests_.erase(it);
  }
  server.pending.clear();
  for (AnswerHandler& handler : handlers) handler(tl::unexpected(why));
}

void Supervisor::set_state(Server& server, ServerState state) {
  if (server.status.state == state) return;
  server.status.state = state;
  if (events_.changed) events_.changed();
}

void Supervisor::check_settled() {
  if (settled_ || stopping_) return;
  if (!gpu_count_known_ && servers_[0]->status.state != ServerState::kFailed) return;
  for (auto& server : servers_) {
    if (server->status.state != ServerState::kRunning &&
        server->status.state != ServerState::kFailed) {
      return;
    }
  }
  settled_ = true;
  if (events_.settled) events_.settled();
}

void Supervisor::stop(std::chrono::milliseconds grace, std::function<void()> done) {
  stopping_ = true;
  stop_done_ = std::move(done);
  bool any = false;
  for (auto& server : servers_) {
    loop_.cancel(server->timer);
    server->timer = 0;
    if (server->process.pid > 0) {
      any = true;
      // Both ways of saying "stop": SIGTERM, and the hang-up a server sees when the daemon is
      // gone (a server asleep in its idle strategy may notice only the latter).
      signal_child(server->process, SIGTERM);
      if (server->control) {
        loop_.unwatch(server->control.get());
        server->control.reset();
      }
      fail_pending(*server, fmt::format("mpsshimd is stopping {}", name(*server)));
      set_state(*server, ServerState::kStopping);
    } else {
      set_state(*server, ServerState::kStopped);
    }
  }
  if (!any) {
    stop_timers_.push_back(loop_.after(0s, [this] { finish_stop(); }));
    return;
  }
  stop_timers_.push_back(loop_.after(grace, [this, grace] {
    for (auto& server : servers_) {
      if (server->process.pid <= 0) continue;
      log_warn("{} did not stop within {}; killing it", name(*server), seconds_text(grace));
      signal_child(server->process, SIGKILL);
    }
  }));
  stop_timers_.push_back(loop_.after(grace + 5s, [this] {
    for (auto& server : servers_) {
      if (server->process.pid > 0) log_error("{} survived SIGKILL; leaving it", name(*server));
    }
    finish_stop();
  }));
}

void Supervisor::finish_stop() {
  for (EventLoop::TimerId timer : stop_timers_) loop_.cancel(timer);
  stop_timers_.clear();
  if (auto done = std::exchange(stop_done_, nullptr)) done();
}

}  // namespace mpsshim::daemon

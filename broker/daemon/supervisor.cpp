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
    if (!server) continue;
    if (server->control) loop_.unwatch(server->control.get());
    if (server->process.pidfd) loop_.unwatch(server->process.pidfd.get());
  }
}

Supervisor::Server* Supervisor::at(int slot) const {
  if (slot < 0 || static_cast<std::size_t>(slot) >= servers_.size()) return nullptr;
  return servers_[slot].get();
}

std::vector<int> Supervisor::running_slots(int ordinal) const {
  std::vector<int> slots;
  if (ordinal < 0 || ordinal >= gpu_count_) return slots;
  if (servers_[ordinal]->status.state == ServerState::kRunning) slots.push_back(ordinal);
  for (std::size_t slot = gpu_count_; slot < servers_.size(); ++slot) {
    const Server* server = servers_[slot].get();
    if (server && server->status.ordinal == ordinal &&
        server->status.state == ServerState::kRunning) {
      slots.push_back(static_cast<int>(slot));
    }
  }
  return slots;
}

std::vector<std::pair<int, ServerStatus>> Supervisor::group_servers() const {
  std::vector<std::pair<int, ServerStatus>> groups;
  for (std::size_t slot = gpu_count_; slot < servers_.size(); ++slot) {
    if (servers_[slot]) groups.emplace_back(static_cast<int>(slot), servers_[slot]->status);
  }
  return groups;
}

const ServerStatus* Supervisor::status_of_slot(int slot) const {
  const Server* server = at(slot);
  return server ? &server->status : nullptr;
}

int Supervisor::past_group_faults(int ordinal) const {
  auto it = past_group_faults_.find(ordinal);
  return it == past_group_faults_.end() ? 0 : it->second;
}

void Supervisor::start() {
  spawn(0);
}

std::string Supervisor::name(const Server& server) const {
  std::string group =
      is_group(server) ? fmt::format(" of isolation group {}", server.status.group) : "";
  if (server.status.pid > 0) {
    return fmt::format("server for GPU {}{} (pid {})", server.status.ordinal, group,
                       server.status.pid);
  }
  return fmt::format("server for GPU {}{}", server.status.ordinal, group);
}

std::vector<std::string> Supervisor::server_arguments(const Server& server) const {
  const int ordinal = server.status.ordinal;
  std::vector<std::string> args{"--device", std::to_string(ordinal), "--control-fd", "3"};
  if (config_.driver_path) args.insert(args.end(), {"--driver", *config_.driver_path});
  args.insert(args.end(), {"--log-level", std::string(log_level_name(config_.log_level))});
  std::vector<std::string> settings = config_.server_settings.arguments();
  args.insert(args.end(), settings.begin(), settings.end());
  if (defaults_.sm_percentage) {
    args.insert(args.end(), {"--default-sm-percentage", std::to_string(*defaults_.sm_percentage)});
  }
  if (std::uint64_t limit = defaults_.memory_limit_of(ordinal); limit != 0) {
    args.insert(args.end(), {"--default-memory-limit", std::to_string(limit)});
  }
  return args;
}

void Supervisor::spawn(int slot) {
  Server& server = *servers_[slot];
  server.slot = slot;
  server.timer = 0;
  proto::UniqueFd ours, theirs;
  if (!proto::seqpacket_pair(ours, theirs)) {
    std::string why = fmt::format("could not be started: socketpair: {}", std::strerror(errno));
    if (is_group(server)) return forget_group_server(server, why);
    schedule_restart(server, why, true);
    return;
  }
  ::fcntl(ours.get(), F_SETFL, O_NONBLOCK);  // a stuck server must never block the daemon
  std::vector<std::string> args = server_arguments(server);
  auto child = spawn_child(SpawnRequest{config_.server_path, args, theirs.get(), config_.output_fd,
                                        config_.nvidia_mps_pipe_directory});
  if (!child) {
    log_error("cannot start the {}: {}", name(server), child.error());
    if (is_group(server))
      return forget_group_server(server, "could not be started: " + child.error());
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
  loop_.watch(server.control.get(), EPOLLIN,
              [this, slot, incarnation](std::uint32_t) { on_control_readable(slot, incarnation); });
  if (server.process.pidfd) {
    loop_.watch(server.process.pidfd.get(), EPOLLIN,
                [this, slot](std::uint32_t) { try_reap(slot); });
  }
  server.timer = loop_.after(kReadyTimeout, [this, slot, incarnation] {
    Server* found = at(slot);
    if (found == nullptr) return;
    Server& s = *found;
    if (s.incarnation != incarnation || s.status.state != ServerState::kStarting) return;
    s.timer = 0;
    log_error("{} did not report ready within {} s; killing it", name(s),
              std::chrono::seconds(kReadyTimeout).count());
    s.start_failed = true;
    s.status.problem = "did not report ready in time";
    signal_child(s.process, SIGKILL);
  });
}

void Supervisor::on_control_readable(int slot, std::uint64_t incarnation) {
  Server* found = at(slot);
  if (found == nullptr) return;
  Server& server = *found;
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
      loop_.after(kHangupGrace, [this, slot, incarnation] {
        Server* found = at(slot);
        if (found == nullptr) return;
        Server& s = *found;
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
    case MessageKind::kServerFault:
      on_fault_report(server, message);
      return;
    default:
      log_debug("{} sent message kind {}; ignored", name(server), header->kind);
  }
}

void Supervisor::on_fault_report(Server& server, const proto::Received& message) {
  auto text = decode<proto::TextMessage>(message);
  if (!text) {
    log_warn("{} sent a truncated fault report ({} bytes); ignored", name(server),
             message.bytes.size());
    return;
  }
  auto report = parse_fault_report(text_of(*text), text->status);
  if (!report) {
    log_warn("{} sent a fault report this daemon cannot read ({}); ignored", name(server),
             report.error());
    return;
  }
  report->gpu = server.status.ordinal;
  report->group = server.status.group;
  report->server_pid = server.process.pid;
  report->when = std::chrono::system_clock::now();
  report->seen = Clock::now();
  log_error("{}: {}", name(server), describe_fault(*report));
  faults_.add(std::move(*report));
  if (events_.changed) events_.changed();
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
  if (is_group(server)) {
    if (ready.status == 0) settle_waiting(server);
    return;
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
  gpu_count_ = count;
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

void Supervisor::try_reap(int slot) {
  Server* found = at(slot);
  if (found == nullptr) return;
  Server& server = *found;
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
  if (server.control) on_control_readable(server.slot, server.incarnation);
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
                    [](auto& s) { return !s || s->process.pid <= 0; })) {
      finish_stop();
    }
    return;
  }
  if (is_group(server)) {
    if (wait_status != -1 && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kExitGpuFault) {
      past_group_faults_[server.status.ordinal] += 1;
    }
    const bool asked = server.status.state == ServerState::kStopping;
    if (asked) {
      log_info("{} {}", who, what);
    } else {
      log_warn("{} {}; the group's next client of GPU {} starts a new one", who, what,
               server.status.ordinal);
    }
    forget_group_server(
        server, server.start_failed ? server.status.problem : fmt::format("{} {}", who, what));
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
    Server& s = *servers_[ordinal];  // a shared server: its slot is its GPU
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

tl::expected<pid_t, std::string> Supervisor::admit(int ordinal, int client_fd,
                                                   const Admission& admission) {
  Server& server = *servers_.at(ordinal);
  if (auto why = unavailable(server)) {
    return tl::unexpected(*why + "; see `mpsshimctl server_list`");
  }
  return send_admit(server, client_fd, admission);
}

tl::expected<pid_t, std::string> Supervisor::send_admit(Server& server, int client_fd,
                                                        const Admission& admission) {
  proto::ServerAdmit admit{};
  admit.header = proto::make_header(MessageKind::kServerAdmit, sizeof admit);
  admit.peer_pid = admission.peer.pid;
  admit.peer_uid = admission.peer.uid;
  admit.peer_gid = admission.peer.gid;
  admit.hello = admission.hello;
  admit.allocation_id = admission.allocation_id;
  admit.allocation_memory_limit = admission.allocation_memory_limit;
  admit.allocation_sm_slot = admission.sm_slot;
  admit.allocation_sm_slots = admission.sm_slots;
  if (admission.partition) {
    admit.sm_partition = admission.partition->id;
    admit.partition_first_group = admission.partition->first_group;
    admit.partition_groups = admission.partition->groups;
  }
  server.admitted_since_poll = true;
  server.idle_since.reset();
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

void Supervisor::admit_to_group(const std::string& group, int ordinal,
                                std::shared_ptr<proto::UniqueFd> client_fd, Admission admission,
                                AdmitDone done) {
  if (group.empty()) return done(admit(ordinal, client_fd->get(), admission));
  if (stopping_) return done(tl::unexpected(std::string("mpsshimd is stopping")));
  if (!gpu_count_known_) {
    return done(tl::unexpected(
        std::string("mpsshimd is still finding the GPUs (the server for GPU 0 is starting)")));
  }
  Server* server = nullptr;
  int on_gpu = 0;
  for (std::size_t slot = gpu_count_; slot < servers_.size(); ++slot) {
    Server* candidate = servers_[slot].get();
    if (candidate == nullptr || candidate->status.ordinal != ordinal) continue;
    ++on_gpu;
    // One that is stopping for idleness is not reused: a new one starts beside it.
    if (candidate->status.group == group && (candidate->status.state == ServerState::kStarting ||
                                             candidate->status.state == ServerState::kRunning)) {
      server = candidate;
    }
  }
  if (server == nullptr) {
    if (on_gpu >= config_.isolation_max_servers) {
      return done(tl::unexpected(fmt::format(
          "GPU {} already runs {} isolation-group servers (mpsshimd --isolation-max-servers), so "
          "isolation group {} cannot have one",
          ordinal, on_gpu, group)));
    }
    const int slot = static_cast<int>(servers_.size());
    servers_.push_back(std::make_unique<Server>());
    server = servers_.back().get();
    server->status.ordinal = ordinal;
    server->status.group = group;
    server->waiting.push_back(WaitingClient{std::move(client_fd), admission, std::move(done)});
    log_info("isolation group {} has its first client of GPU {}: starting its server", group,
             ordinal);
    spawn(slot);  // may forget the server at once, telling the client why
    if (group_poll_ == 0 && at(slot) != nullptr) {
      group_poll_ = loop_.after(group_poll_interval(), [this] { poll_group_servers(); });
    }
    return;
  }
  if (server->status.state == ServerState::kStarting) {
    server->waiting.push_back(WaitingClient{std::move(client_fd), admission, std::move(done)});
    return;
  }
  if (auto why = unavailable(*server)) return done(tl::unexpected(*why));
  done(send_admit(*server, client_fd->get(), admission));
}

void Supervisor::settle_waiting(Server& server) {
  for (WaitingClient& waiting : std::exchange(server.waiting, {})) {
    if (auto why = unavailable(server)) {
      waiting.done(tl::unexpected(*why));
    } else {
      waiting.done(send_admit(server, waiting.fd->get(), waiting.admission));
    }
  }
}

void Supervisor::forget_group_server(Server& server, const std::string& why) {
  const int slot = server.slot;
  for (WaitingClient& waiting : std::exchange(server.waiting, {})) {
    waiting.done(tl::unexpected(fmt::format("the {} could not start: {}", name(server), why)));
  }
  fail_pending(server, why);
  loop_.cancel(server.timer);
  if (server.control) loop_.unwatch(server.control.get());
  if (server.process.pidfd) loop_.unwatch(server.process.pidfd.get());
  servers_[slot].reset();
  if (events_.changed) events_.changed();
}

std::chrono::milliseconds Supervisor::group_poll_interval() const {
  const auto quarter =
      std::chrono::duration_cast<std::chrono::milliseconds>(config_.isolation_idle_timeout) / 4;
  return std::clamp<std::chrono::milliseconds>(quarter, 250ms, 5s);
}

void Supervisor::poll_group_servers() {
  group_poll_ = 0;
  if (stopping_) return;
  bool any = false;
  for (std::size_t slot = gpu_count_; slot < servers_.size(); ++slot) {
    Server* server = servers_[slot].get();
    if (server == nullptr) continue;
    any = true;
    if (server->status.state != ServerState::kRunning || !server->control) continue;
    server->admitted_since_poll = false;
    const std::uint64_t incarnation = server->incarnation;
    request(static_cast<int>(slot), MessageKind::kServerStatsQuery, "", group_poll_interval(),
            [this, slot = static_cast<int>(slot), incarnation](auto answer) {
              on_group_poll_answer(slot, incarnation, answer);
            });
  }
  if (any) group_poll_ = loop_.after(group_poll_interval(), [this] { poll_group_servers(); });
}

void Supervisor::on_group_poll_answer(int slot, std::uint64_t incarnation,
                                      const tl::expected<ServerAnswer, std::string>& answer) {
  Server* server = at(slot);
  if (server == nullptr || server->incarnation != incarnation || !answer || stopping_ ||
      server->status.state != ServerState::kRunning) {
    return;
  }
  // One line per client, each starting "client=" (client_table.hpp).
  bool has_clients =
      answer->text.starts_with("client=") || answer->text.find("\nclient=") != std::string::npos;
  // A client admitted after the question was sent may be missing from the answer.
  if (has_clients || server->admitted_since_poll) {
    server->idle_since.reset();
    return;
  }
  const Clock::time_point now = Clock::now();
  if (!server->idle_since) server->idle_since = now;
  if (now - *server->idle_since < config_.isolation_idle_timeout) return;
  log_info("{} has had no clients for {}; stopping it", name(*server),
           seconds_text(now - *server->idle_since));
  set_state(*server, ServerState::kStopping);
  signal_child(server->process, SIGTERM);
  loop_.unwatch(server->control.get());
  server->control.reset();
  fail_pending(*server, fmt::format("{} is stopping", name(*server)));
  const std::uint64_t stopping = server->incarnation;
  server->timer = loop_.after(kGroupStopGrace, [this, slot, stopping] {
    Server* s = at(slot);
    if (s == nullptr || s->incarnation != stopping || s->process.pid <= 0) return;
    s->timer = 0;
    log_warn("{} did not stop within {}; killing it", name(*s), seconds_text(kGroupStopGrace));
    signal_child(s->process, SIGKILL);
  });
}

void Supervisor::request(int slot, MessageKind kind, std::string_view text,
                         std::chrono::milliseconds timeout, AnswerHandler handler) {
  Server* found = at(slot);
  if (found == nullptr) {
    handler(tl::unexpected(std::string("that isolation group's server has stopped")));
    return;
  }
  Server& server = *found;
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
  requests_.emplace(id, Request{std::move(handler), timer, name(server), timeout});
}

void Supervisor::expire_request(std::uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request request = std::move(it->second);
  requests_.erase(it);
  // Its PendingAnswer stays queued so that a late answer is matched to it, not to the next one.
  request.handler(tl::unexpected(fmt::format("the {} did not answer within {}", request.server,
                                             seconds_text(request.timeout))));
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
  for (int ordinal = 0; ordinal < gpu_count_; ++ordinal) {
    const auto& server = servers_[ordinal];
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
  loop_.cancel(group_poll_);
  group_poll_ = 0;
  bool any = false;
  for (auto& server : servers_) {
    if (!server) continue;
    for (WaitingClient& waiting : std::exchange(server->waiting, {})) {
      waiting.done(tl::unexpected(std::string("mpsshimd is stopping")));
    }
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
      if (!server || server->process.pid <= 0) continue;
      log_warn("{} did not stop within {}; killing it", name(*server), seconds_text(grace));
      signal_child(server->process, SIGKILL);
    }
  }));
  stop_timers_.push_back(loop_.after(grace + 5s, [this] {
    for (auto& server : servers_) {
      if (server && server->process.pid > 0) {
        log_error("{} survived SIGKILL; leaving it", name(*server));
      }
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

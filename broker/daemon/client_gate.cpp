#include "broker/daemon/client_gate.hpp"

#include <cuda.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "broker/daemon/allocation_quota.hpp"
#include "broker/daemon/child_process.hpp"
#include "broker/daemon/device_directory.hpp"
#include "broker/daemon/log.hpp"
#include "broker/daemon/visible_devices.hpp"
#include "broker/daemon/wire.hpp"
#include "proto/text_parts.hpp"

namespace mpsshim::daemon {

namespace {

using proto::MessageKind;

// "client 4123 (python3, uid 1000)" / "mpsshimctl 4123 (uid 0)"
std::string describe_client(const proto::PeerCredentials& peer, const std::string& program) {
  return fmt::format("client {} ({}, uid {})", peer.pid, program.empty() ? "?" : program, peer.uid);
}

std::string describe_peer(const proto::PeerCredentials& peer) {
  return fmt::format("pid {} ({}, uid {})", peer.pid, process_name(peer.pid), peer.uid);
}

// register_allocation may carry a pod's token (token=HEX): the log is no place for it.
std::string without_tokens(std::string line) {
  for (std::size_t at = line.find("token="); at != std::string::npos;
       at = line.find("token=", at + 1)) {
    std::size_t end = line.find(' ', at);
    line.replace(at + 6, (end == std::string::npos ? line.size() : end) - (at + 6), "(hidden)");
  }
  return line;
}

}  // namespace

ClientGate::ClientGate(EventLoop& loop, Supervisor& supervisor, Commands& commands,
                       const AllocationRegistry& allocations, AccessPolicy policy,
                       IsolationRule isolation, const std::vector<ClientClass>* classes,
                       std::chrono::seconds isolate_after_fault)
    : loop_(loop),
      supervisor_(supervisor),
      commands_(commands),
      allocations_(allocations),
      policy_(policy),
      isolation_(isolation),
      classes_(classes),
      isolate_after_fault_(isolate_after_fault) {}

ClientGate::~ClientGate() {
  close();
}

void ClientGate::listen(proto::UniqueFd listener) {
  listener_ = std::move(listener);
  loop_.watch(listener_.get(), EPOLLIN, [this](std::uint32_t) { accept_all(); });
}

void ClientGate::close() {
  if (listener_) {
    loop_.unwatch(listener_.get());
    listener_.reset();
  }
  for (auto& [fd, connection] : waiting_) {
    loop_.unwatch(fd);
    loop_.cancel(connection.deadline);
  }
  waiting_.clear();
}

void ClientGate::accept_all() {
  // Bounded, so a flood of connections cannot starve the servers' sockets.
  for (int budget = 64; budget > 0 && listener_; --budget) {
    proto::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        log_error("accepting a connection failed: {}", std::strerror(errno));
      }
      return;
    }
    auto peer = proto::peer_credentials(fd.get());
    if (!peer) continue;
    if (waiting_.size() >= kMaxWaiting) {
      log_warn("{} dropped: {} connections are already waiting to say who they are",
               describe_peer(*peer), waiting_.size());
      continue;
    }
    int raw = fd.get();
    EventLoop::TimerId deadline = loop_.after(kFirstMessageTimeout, [this, raw] {
      Waiting connection = take(raw);
      log_warn("{} connected but sent nothing for {} s; closed", describe_peer(connection.peer),
               std::chrono::seconds(kFirstMessageTimeout).count());
    });
    waiting_.emplace(raw, Waiting{std::move(fd), *peer, deadline});
    loop_.watch(raw, EPOLLIN, [this, raw](std::uint32_t) { on_readable(raw); });
  }
}

ClientGate::Waiting ClientGate::take(int fd) {
  auto node = waiting_.extract(fd);
  loop_.unwatch(fd);
  loop_.cancel(node.mapped().deadline);
  return std::move(node.mapped());
}

void ClientGate::on_readable(int fd) {
  if (!waiting_.contains(fd)) return;
  int error = proto::receive_message(fd, scratch_);
  if (error == EAGAIN || error == EWOULDBLOCK) return;
  Waiting connection = take(fd);
  if (error != 0) {
    log_warn("{}: unreadable first message ({}); closed", describe_peer(connection.peer),
             std::strerror(error));
    return;
  }
  if (scratch_.bytes.empty()) {
    log_debug("{} hung up without a word", describe_peer(connection.peer));
    return;
  }
  on_first_message(std::move(connection), scratch_);
  scratch_.fds.clear();  // a first message carries none: whatever came is closed now
}

void ClientGate::refuse(const Waiting& connection, int cuda_error, const std::string& message) {
  // Best effort: the socket is fresh, so this cannot block; a peer that has gone is no loss.
  proto::send_struct(connection.fd.get(), make_refused(cuda_error, message));
}

void ClientGate::on_first_message(Waiting connection, const proto::Received& message) {
  auto header = header_of(message);
  if (!header || header->magic != proto::kHelloMagic) {
    log_warn("{} sent something that is not mpsshim's protocol; closed",
             describe_peer(connection.peer));
    return;
  }
  auto kind = static_cast<MessageKind>(header->kind);
  if (!message.fds.empty()) {
    std::string text = fmt::format(
        "sent {} file descriptor(s) with its first message; a hello or an mpsshimctl command "
        "carries none",
        message.fds.size());
    log_warn("{} refused: {}", describe_peer(connection.peer), text);
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, text);
    return;
  }
  if (header->abi_major != proto::kAbiMajor) {
    bool operator_tool = kind == MessageKind::kCtlRequest;
    std::string text = fmt::format(
        "{} speaks mpsshim ABI {}.{}, this daemon speaks {}.{}; use matching {} and mpsshimd",
        operator_tool ? "mpsshimctl" : "client", header->abi_major, header->abi_minor,
        proto::kAbiMajor, proto::kAbiMinor, operator_tool ? "mpsshimctl" : "libmpsshim.so");
    log_warn("{} refused: {}", describe_peer(connection.peer), text);
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, text);
    return;
  }
  switch (kind) {
    case MessageKind::kClientQuery:
    case MessageKind::kClientAttach:
      // A 1.0-1.3 client's hello is shorter: what it did not send reads as zero (no token).
      if (message.bytes.size() >= proto::kClientHelloSizeBeforeTokens) {
        // A later minor version may append fields, within kMaxHelloBytes; the header's size
        // must say what arrived.
        if (message.bytes.size() > kMaxHelloBytes || header->size != message.bytes.size()) {
          std::string text = fmt::format(
              "sent a {}-byte hello whose header says {} bytes; a hello is at most {} bytes and "
              "its header gives its size",
              message.bytes.size(), header->size, kMaxHelloBytes);
          log_warn("{} refused: {}", describe_peer(connection.peer), text);
          refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, text);
          return;
        }
        proto::ClientHello hello{};
        std::memcpy(&hello, message.bytes.data(), std::min(message.bytes.size(), sizeof hello));
        return on_client(std::move(connection), kind, hello);
      }
      break;
    case MessageKind::kClientView:
      if (message.bytes.size() == sizeof(proto::ClientViewRequest) &&
          header->size == message.bytes.size()) {
        proto::ClientViewRequest request{};
        std::memcpy(&request, message.bytes.data(), sizeof request);
        return on_client_view(std::move(connection), request);
      }
      break;
    case MessageKind::kCtlRequest:
      if (auto request = decode<proto::TextMessage>(message)) {
        return on_command(std::move(connection), *request);
      }
      break;
    default: {
      std::string text = fmt::format(
          "message kind {} cannot open a connection to mpsshimd; expected a client hello or an "
          "mpsshimctl command",
          header->kind);
      log_warn("{} refused: {}", describe_peer(connection.peer), text);
      refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, text);
      return;
    }
  }
  log_warn("{} sent a truncated message of kind {} ({} bytes); closed",
           describe_peer(connection.peer), header->kind, message.bytes.size());
}

namespace {

// CUDA_MPS_SM_PARTITION: the partition a client is pinned to (nullptr: none), or why it cannot
// run there (`gpu` -1: a device query, which opens no GPU yet). A client is never run outside the
// partition it asked for.
tl::expected<const SmPartition*, std::string> pinned_partition(const SmPartitionTable& partitions,
                                                               const proto::ClientHello& hello,
                                                               int gpu) {
  if (hello.sm_partition == 0) return nullptr;
  if (hello.sm_partition == proto::kBadSmPartition) {
    return tl::unexpected(std::string(
        "CUDA_MPS_SM_PARTITION does not name a partition id; `mpsshimctl lspart` lists them"));
  }
  const SmPartition* partition = partitions.find(hello.sm_partition);
  if (partition == nullptr) {
    return tl::unexpected(fmt::format(
        "CUDA_MPS_SM_PARTITION={}: no such SM partition; `mpsshimctl lspart` lists them and "
        "`mpsshimctl sm_partition add <gpu> <sms>` makes one",
        hello.sm_partition));
  }
  if (gpu >= 0 && partition->gpu != gpu) {
    return tl::unexpected(fmt::format(
        "CUDA_MPS_SM_PARTITION={} is a partition of GPU {}, but the client opened GPU {}; set "
        "CUDA_VISIBLE_DEVICES to the partition's GPU",
        partition->id, partition->gpu, gpu));
  }
  return partition;
}

}  // namespace

std::optional<std::string> ClientGate::accept_client(const Waiting& connection,
                                                     proto::ClientHello& hello) {
  hello.visible_devices[sizeof hello.visible_devices - 1] = '\0';
  hello.program[sizeof hello.program - 1] = '\0';
  hello.allocation_token[sizeof hello.allocation_token - 1] = '\0';
  std::string who = describe_client(connection.peer, hello.program);
  if (auto why = policy_.refusal(connection.peer, PeerRole::kClient)) {
    log_warn("{} refused: {}", who, *why);
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, *why);
    return std::nullopt;
  }
  return who;
}

void ClientGate::on_client(Waiting connection, MessageKind kind, const proto::ClientHello& sent) {
  proto::ClientHello hello = sent;
  auto accepted = accept_client(connection, hello);
  if (!accepted) return;
  const std::string& who = *accepted;
  if (kind == MessageKind::kClientQuery) {
    // An unknown token fails cuInit already, where the client's error is easiest to read.
    if (auto quota = decide_quota(allocations_, supervisor_.defaults(), hello, -1); !quota) {
      log_warn("{} refused: {}", who, quota.error());
      refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, quota.error());
      return;
    }
    // An unknown partition fails cuInit too.
    if (auto partition = pinned_partition(supervisor_.partitions(), hello, -1); !partition) {
      log_warn("{} refused: {}", who, partition.error());
      refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, partition.error());
      return;
    }
    auto answer = answer_query(supervisor_, hello);
    if (!answer) {
      log_warn("{} asked for its devices; refused: {}", who, answer.error().message);
      refuse(connection, answer.error().cuda_error, answer.error().message);
      return;
    }
    log_debug("{} asked for its devices (CUDA_VISIBLE_DEVICES=\"{}\")", who, hello.visible_devices);
    if (int error = proto::send_message(connection.fd.get(), *answer); error != 0) {
      log_warn("{} could not be sent its devices: {}", who, std::strerror(error));
    }
    return;
  }
  auto gpu = resolve_attach(supervisor_, hello);
  if (!gpu) {
    log_warn("{} asked for device {}; refused: {}", who, hello.device, gpu.error().message);
    refuse(connection, gpu.error().cuda_error, gpu.error().message);
    return;
  }
  auto quota = decide_quota(allocations_, supervisor_.defaults(), hello, *gpu);
  if (!quota) {
    log_warn("{} refused: {}", who, quota.error());
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, quota.error());
    return;
  }
  for (const std::string& clamp : quota->clamps) log_warn("{} {}", who, clamp);
  auto partition = pinned_partition(supervisor_.partitions(), hello, *gpu);
  if (!partition) {
    log_warn("{} refused: {}", who, partition.error());
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, partition.error());
    return;
  }
  std::string group = isolation_group(isolation_, connection.peer, hello, quota->allocation_id);
  std::string class_name;
  if (classes_ != nullptr && !classes_->empty()) {
    if (const ClientClass* cls =
            class_of(*classes_, connection.peer, cgroup_of(connection.peer.pid),
                     quota->allocation_id != 0)) {
      class_name = cls->name;
      for (const std::string& lowered : apply_class(*cls, quota->hello)) {
        log_warn("{} {}", who, lowered);
      }
      // A client's own request for its own servers still wins: it only adds isolation.
      if (cls->isolated && (hello.flags & proto::kHelloOwnIsolationGroup) == 0) {
        group = "class:" + cls->name;
      }
    }
  }
  if (quota->allocation_id != 0 && !group.starts_with("client:")) {
    // The device plugin asked for this pod to have servers of its own (register_allocation
    // isolation=own): narrower than a uid's or a class's group, wider than one client's.
    const Allocation* allocation = allocations_.find(quota->allocation_id);
    if (allocation != nullptr && allocation->own_isolation_group) {
      group = fmt::format("allocation:{}", quota->allocation_id);
    }
  }
  if (isolate_after_fault_.count() > 0 && !group.starts_with("client:")) {
    // A program whose work was the likely cause of a recent fault gets its own servers, so a
    // repeat takes only it down. Keyed by the uid and the program name the client gives: a
    // client can rename itself out of this, so it limits accidents, not attacks.
    std::string program = bounded_string(hello.program);
    if (program.empty()) program = "unnamed";
    if (auto fault = supervisor_.faults().recent_culprit(connection.peer.uid, program, Clock::now(),
                                                         isolate_after_fault_)) {
      group = fmt::format("client:{}", connection.peer.pid);
      log_warn(
          "{} gets an isolation group of its own: {} run by uid {} was the likely cause of a "
          "GPU fault on GPU {} {} s ago (--isolate-after-fault)",
          who, program, connection.peer.uid, fault->gpu,
          std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - fault->seen).count());
    }
  }
  if (*partition != nullptr && !group.empty()) {
    // A partition is a cut of the shared server's SMs; another process cannot run inside it.
    std::string text = fmt::format(
        "CUDA_MPS_SM_PARTITION={} is a partition of GPU {}'s shared server, but this client "
        "belongs to isolation group {}, which has a server of its own",
        (*partition)->id, *gpu, group);
    log_warn("{} refused: {}", who, text);
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, text);
    return;
  }
  Admission admission{connection.peer,      quota->hello,
                      quota->allocation_id, quota->allocation_memory_limit,
                      quota->sm_slot,       quota->sm_slots};
  if (*partition != nullptr) admission.partition = **partition;
  // The server gets its own copy of the fd and answers the client directly; ours closes once
  // the admission is settled (a new group's server may take a moment to start).
  auto fd = std::make_shared<proto::UniqueFd>(std::move(connection.fd));
  std::string in = class_name.empty() ? "" : fmt::format(" in class {}", class_name);
  if (!group.empty()) in += fmt::format(" in isolation group {}", group);
  if (quota->allocation_id != 0) {
    in += fmt::format(" in allocation {} (pod {})", quota->allocation_id, quota->pod);
  }
  supervisor_.admit_to_group(
      group, *gpu, fd, std::move(admission),
      [fd, who, gpu = *gpu, in](tl::expected<pid_t, std::string> server) {
        if (!server) {
          log_warn("{} refused: {}", who, server.error());
          proto::send_struct(fd->get(),
                             make_refused(CUDA_ERROR_MPS_SERVER_NOT_READY, server.error()));
          return;
        }
        log_info("{} attached to GPU {} (server pid {}){}", who, gpu, *server, in);
      });
}

void ClientGate::on_client_view(Waiting connection, const proto::ClientViewRequest& sent) {
  proto::ClientViewRequest request = sent;
  proto::ClientHello& hello = request.hello;
  auto accepted = accept_client(connection, hello);
  if (!accepted) return;
  const std::string& who = *accepted;
  auto visible = visible_gpus(supervisor_, hello);
  if (!visible) {
    refuse(connection, visible.error().cuda_error, visible.error().message);
    return;
  }
  auto scope_quota = decide_quota(allocations_, supervisor_.defaults(), hello, -1);
  if (!scope_quota) {
    log_warn("{} asked for its share; refused: {}", who, scope_quota.error());
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, scope_quota.error());
    return;
  }
  ViewContext context;
  context.scope.allocation_id = scope_quota->allocation_id;
  context.scope.pod = scope_quota->pod;
  context.scope.cgroup = cgroup_identity(connection.peer.pid);
  const ClientClass* cls =
      classes_ != nullptr && !classes_->empty()
          ? class_of(*classes_, connection.peer, cgroup_of(connection.peer.pid),
                     scope_quota->allocation_id != 0)
          : nullptr;
  for (std::size_t k = 0; k < visible->size(); ++k) {
    const int gpu = (*visible)[k];
    const auto& snapshot = supervisor_.status(gpu).snapshot;
    if (!snapshot) continue;
    // The quota an attach to this GPU would get, as on_client decides it.
    proto::ClientHello asked = hello;
    asked.device = static_cast<std::int32_t>(k);
    if (k < proto::kViewOrdinals && request.memory_limit_by_ordinal[k] != 0) {
      asked.device_memory_limit = request.memory_limit_by_ordinal[k];
    }
    auto quota = decide_quota(allocations_, supervisor_.defaults(), asked, gpu);
    if (!quota) continue;  // a GPU its allocation does not hold
    if (cls != nullptr) apply_class(*cls, quota->hello);
    ViewGpu view;
    view.gpu = gpu;
    view.ordinal = static_cast<int>(k);
    view.uuid = format_gpu_uuid(snapshot->uuid);
    view.total_memory = snapshot->total_memory;
    view.sms = snapshot->sm_count;
    // An allocation's clients share its limit; anyone else has the limit each client gets.
    view.memory_limit = quota->allocation_memory_limit != 0 ? quota->allocation_memory_limit
                        : quota->hello.device_memory_limit != 0
                            ? quota->hello.device_memory_limit
                            : supervisor_.defaults().memory_limit_of(gpu);
    view.sm_percentage = quota->hello.active_thread_percentage != proto::kUnset
                             ? quota->hello.active_thread_percentage
                             : supervisor_.defaults().sm_percentage.value_or(100);
    context.gpus.push_back(std::move(view));
  }
  const long requester = connection.peer.pid;
  context.visible_pid = [requester](long pid) { return pid_seen_by(pid, requester); };
  context.cgroup_of = [](long pid) { return cgroup_identity(pid); };
  log_debug("{} asked for its share (scope: {})", who,
            context.scope.allocation_id != 0
                ? fmt::format("allocation {}", context.scope.allocation_id)
                : "cgroup " + context.scope.cgroup);
  int fd = connection.fd.get();
  answering_.emplace(fd, std::move(connection.fd));
  views_waiting_.push_back(WaitingView{fd, std::move(context)});
  // One round of the servers' answers serves every view asked for meanwhile, so that views
  // asked in a burst cost the servers one `ps` (two when busy time starts a window).
  if (views_waiting_.size() == 1) ask_servers_for_views();
}

void ClientGate::ask_servers_for_views() {
  commands_.query_clients("", [this](std::vector<ServerClients> ps, std::string, std::string) {
    const auto now = BusySampler::Clock::now();
    if (!busy_.needs_reading(ps, now)) return answer_views(ps);
    // No recent reading of busy time: this answer starts a window, the next one ends it.
    busy_.take(ps, now);
    loop_.after(BusySampler::kMinWindow, [this] {
      commands_.query_clients("", [this](std::vector<ServerClients> later, std::string,
                                         std::string) { answer_views(later); });
    });
  });
}

void ClientGate::answer_views(const std::vector<ServerClients>& ps) {
  const BusySampler::Deltas deltas = busy_.take(ps, BusySampler::Clock::now());
  for (const WaitingView& waiting : std::exchange(views_waiting_, {})) {
    auto node = answering_.extract(waiting.fd);
    if (node.empty()) continue;
    nlohmann::json view = build_client_view(waiting.context, ps, deltas);
    std::string text = view.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    for (const proto::TextMessage& part :
         proto::text_messages(MessageKind::kClientViewReply, 0, text)) {
      if (proto::send_struct(node.mapped().get(), part) != 0) break;
    }
  }
}

void ClientGate::on_command(Waiting connection, const proto::TextMessage& request) {
  std::string line = text_of(request);
  if (auto why = policy_.refusal(connection.peer, PeerRole::kOperator)) {
    log_warn("mpsshimctl {} (uid {}) refused: {}", connection.peer.pid, connection.peer.uid, *why);
    refuse(connection, CUDA_ERROR_MPS_CONNECTION_FAILED, *why);
    return;
  }
  // The device plugin asks these every second: an info line each would drown the log.
  const bool polling = line == "gpu_states" || line == "list_allocations";
  log_at(polling ? LogLevel::kDebug : LogLevel::kInfo, "operator command from pid {} (uid {}): {}",
         connection.peer.pid, connection.peer.uid, without_tokens(line));
  int fd = connection.fd.get();
  answering_.emplace(fd, std::move(connection.fd));
  commands_.execute(line, [this, fd](CtlReply reply) {
    auto node = answering_.extract(fd);
    if (node.empty()) return;
    if (!reply.text.empty() && reply.text.back() != '\n') reply.text += '\n';
    // A long answer goes in parts (proto/text_parts.hpp); mpsshimctl puts them together.
    for (const proto::TextMessage& part :
         proto::text_messages(MessageKind::kCtlReply, reply.status, reply.text)) {
      if (proto::send_struct(node.mapped().get(), part) != 0) break;
    }
  });
}

}  // namespace mpsshim::daemon

#include <fcntl.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string_view>

#include "broker/server/core/server.hpp"
#include "broker/server/scheduling/quota.hpp"
#include "broker/server/session/host_callbacks.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

template <std::size_t N>
std::string bounded_string(const char (&chars)[N]) {
  return std::string(chars, ::strnlen(chars, N));
}

std::string describe_limit(std::uint64_t limit) {
  return limit == 0 ? "no memory limit" : fmt::format("a memory limit of {}", format_bytes(limit));
}

}  // namespace

void Server::refuse(int client_fd, CUresult error, const std::string& message) {
  proto::Refused refused{};
  refused.header = proto::make_header(proto::MessageKind::kRefused, sizeof refused);
  refused.cuda_error = static_cast<std::int32_t>(error);
  std::size_t n = std::min(message.size(), sizeof refused.message - 1);
  std::memcpy(refused.message, message.data(), n);
  proto::send_struct(client_fd, refused);
}

std::shared_ptr<AllocationAccount> Server::allocation_account(std::uint32_t id,
                                                              std::uint64_t limit) {
  std::erase_if(allocations_, [](const auto& entry) { return entry.second.expired(); });
  if (auto known = allocations_[id].lock()) return known;
  auto account = std::make_shared<AllocationAccount>(id, limit);
  allocations_[id] = account;
  return account;
}

void Server::admit(const proto::ServerAdmit& admit, proto::UniqueFd client) {
  const proto::ClientHello& hello = admit.hello;
  ClientInfo info;
  info.id = next_client_id_++;
  info.pid = admit.peer_pid;
  info.uid = admit.peer_uid;
  info.gid = admit.peer_gid;
  info.program = bounded_string(hello.program);
  if (info.program.empty()) info.program = "unnamed";

  if (stopping_) {
    refuse(client.get(), CUDA_ERROR_MPS_SERVER_NOT_READY,
           "the mpsshim server of this GPU is shutting down");
    return;
  }
  if (hello.header.magic != proto::kHelloMagic || hello.header.abi_major != proto::kAbiMajor) {
    std::string message = fmt::format(
        "mpsshim version mismatch: the client speaks ABI {}.{}, this server {}.{}; use the "
        "libmpsshim.so that came with the running mpsshimd",
        hello.header.abi_major, hello.header.abi_minor, proto::kAbiMajor, proto::kAbiMinor);
    log_warn("refused pid {} ({}): {}", info.pid, info.program, message);
    refuse(client.get(), CUDA_ERROR_MPS_CONNECTION_FAILED, message);
    return;
  }
  int flags = ::fcntl(client.get(), F_GETFL);
  if (flags >= 0) ::fcntl(client.get(), F_SETFL, flags | O_NONBLOCK);

  if (auto held = lease_.acquire(); !held) {
    log_error("could not admit pid {} ({}): {}", info.pid, info.program, held.error());
    refuse(client.get(), CUDA_ERROR_MPS_SERVER_NOT_READY, held.error());
    return;
  }
  auto session = std::make_unique<Session>(gpu_, green_pool_, ipc_, info);
  session->set_image_cache(&images_);
  Session& s = *session;
  auto fail = [&](CUresult error, const std::string& why) {
    log_error("could not admit {}: {}", s.who(), why);
    free_everything(s);
    refuse(client.get(), error, why);
  };

  // SM quota: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, else the server's default.
  int percentage = hello.active_thread_percentage;
  if (percentage == proto::kUnset) {
    percentage = settings_.default_sm_percentage;
  } else if (percentage < 1 || percentage > 100) {
    log_warn("{} asked for {}% of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); using {}%", s.who(),
             percentage, std::clamp(percentage, 1, 100));
  }
  s.launch_batching = (hello.flags & proto::kHelloNoLaunchBatching) == 0;
  s.rings_when_awaited = hello.header.abi_minor >= proto::kAbiMinorDoze;
  s.busy.on = settings_.busy_time;
  s.fences.use_words = settings_.host_fences;
  s.fences.event_poll = settings_.event_poll;
  s.limits = settings_.client_limits;
  const proto::DeviceSnapshot& snap = gpu_.snapshot;
  // An allocation's SMs lie in its slot (its replica) of the device; a static partition's
  // client's in its partition (green_context.hpp).
  SmPlacement placement{admit.allocation_sm_slot, admit.allocation_sm_slots};
  if (admit.sm_partition != 0) {
    placement =
        SmPlacement{0, 0, admit.sm_partition, admit.partition_first_group, admit.partition_groups};
  }
  const int priority_span = std::abs(snap.stream_priority_least - snap.stream_priority_greatest);
  s.priority_bias =
      hello.priority == proto::kUnset ? 0 : std::clamp(hello.priority, 0, priority_span);
  s.priority.below_normal = s.priority_bias > 0;
  // With SMs reserved for normal-priority clients (priority_reserve.hpp), a normal client's
  // smaller share lies at the device's end, over the reserve; a below-normal client without a
  // placement of its own leaves the reserve while a normal client is connected.
  if (sm_reserve_.on() && !placement.placed()) {
    if (s.priority.below_normal) {
      s.sm.reserve = sm_reserve_;
      s.sm.kept_out_of_reserve = priority_board_.normal_sessions() > 0;
    } else {
      placement.at_device_end = true;
    }
  }
  const PlannedQuota planned = plan_client_quota(
      snap, percentage, (hello.flags & proto::kHelloIgnoreSmCoscheduling) != 0, placement);
  const SmQuota& quota = planned.quota;
  const bool ignore_coscheduling = planned.ignore_coscheduling;
  auto green = make_client_green_context(green_pool_, gpu_, percentage, planned, placement,
                                         s.sm.reserve, s.sm.kept_out_of_reserve);
  if (!green) {
    return fail(green.error(), fmt::format("creating its green context of {} SMs failed: {}",
                                           quota.target, describe(*gpu_.cu, green.error())));
  }
  s.green = *green;
  s.sm.percentage = std::clamp(percentage, 1, 100);
  s.sm.ignore_coscheduling = ignore_coscheduling;
  s.sm.placement = placement;

  if (admit.allocation_id != 0) {
    s.charge.set_allocation(allocation_account(admit.allocation_id, admit.allocation_memory_limit));
  }
  if (hello.device_memory_limit != 0) {
    s.charge.set_limit(hello.device_memory_limit, LimitSource::kClient);
  } else {
    s.charge.set_limit(settings_.default_memory_limit, LimitSource::kServerDefault);
  }
  if (std::string why = overcommit_refusal(s.charge.limit()); !why.empty()) {
    return fail(CUDA_ERROR_OUT_OF_MEMORY, why);
  }
  s.memory_arbiter = memory_arbiter_.get();
  // A normal client outranks a below-normal one on the GPU too (priority_gate.hpp).
  s.priority_boost = settings_.priority.enabled && !s.priority.below_normal ? 1 : 0;

  auto segment =
      SharedSegment::create(fmt::format("mpsshim-client-{}", info.id), settings_.geometry);
  if (!segment) return fail(CUDA_ERROR_OUT_OF_MEMORY, segment.error());
  s.segment = std::move(*segment);
  const proto::SegmentHeader& geometry = s.segment.geometry();
  s.ring = proto::RingConsumer(s.segment.view().ring(), geometry.ring_capacity);
  s.slot_busy.assign(geometry.slot_count, 0);
  // Registered once, so every staged copy is a direct DMA from or into shared memory.
  if (CUresult r = gpu_.cu->cuMemHostRegister_v2(s.segment.staging(), s.segment.staging_bytes(),
                                                 CU_MEMHOSTREGISTER_PORTABLE);
      r != CUDA_SUCCESS) {
    return fail(r, fmt::format("registering its {} staging area failed: {}",
                               format_bytes(s.segment.staging_bytes()), describe(*gpu_.cu, r)));
  }
  s.staging_registered = true;
  s.doorbell.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!s.doorbell) {
    return fail(CUDA_ERROR_OPERATING_SYSTEM, fmt::format("eventfd: {}", std::strerror(errno)));
  }

  proto::SessionWelcome welcome{};
  welcome.header = proto::make_header(proto::MessageKind::kSessionWelcome, sizeof welcome);
  welcome.client_id = info.id;
  welcome.sm_count = s.green.sm_count;
  welcome.segment_bytes = geometry.segment_bytes;
  welcome.memory_limit = s.charge.limit();
  welcome.physical_ordinal = gpu_.ordinal;
  welcome.priority = s.priority_bias;
  // The watch page (host_fences.hpp): for a client that takes it and a session with host
  // fences; without one the worker polls the session's synchronizes as before.
  proto::UniqueFd watch_page;
  if (settings_.fence_watch && s.fences.use_words &&
      hello.header.abi_minor >= proto::kAbiMinorFenceWatch) {
    if (auto page = s.fences.words.open_watch_page()) {
      watch_page = std::move(*page);
    } else {
      log_warn("{}: no watch page, its synchronizes are polled: {}", s.who(), page.error());
    }
  }
  const int fds[3] = {s.segment.fd(), s.doorbell.get(), watch_page.get()};
  const std::span<const int> sent(fds, watch_page ? 3 : 2);
  if (int rc = proto::send_struct(client.get(), welcome, sent); rc != 0) {
    log_warn("{} left before its session started ({})", s.who(), std::strerror(rc));
    free_everything(s);
    return;
  }
  std::string callbacks_error;
  s.callbacks = HostCallbackChannel::open(s.segment.fd(), s.segment.geometry(), client.get(),
                                          s.who(), &callbacks_error);
  if (!s.callbacks) log_warn("{}: host functions are unavailable: {}", s.who(), callbacks_error);
  s.segment.close_fd();  // the mapping stays; the client has its own copy of the fd
  s.socket = std::move(client);

  Worker& worker = least_loaded();
  log_info("client {} (pid {}, {}, uid {}) connected: {} of {} SMs{}, {}{}; served by worker {}",
           info.id, info.pid, info.program, info.uid, s.green.sm_count, snap.sm_count,
           s.green.outside_reserve
               ? fmt::format(" ({} held back for normal-priority clients)", s.green.held_back_sms)
               : std::string(),
           describe_limit(s.charge.limit()),
           s.charge.allocation()
               ? fmt::format(" in allocation {} (shared {})", s.charge.allocation()->id(),
                             describe_limit(s.charge.allocation()->limit()))
               : "",
           worker.index());
  const bool normal = !s.priority.below_normal;
  priority_board_.joined(s.priority.below_normal);
  // From here on the session belongs to the worker's thread.
  worker.adopt(std::move(session));
  // Below-normal sessions leave the reserve at their worker's next pass, idle or not.
  if (normal && sm_reserve_.on()) nudge_workers();
}

}  // namespace mpsshim::server

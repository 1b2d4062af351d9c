#include "broker/server/session/session.hpp"
#include "broker/server/session/busy_time.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "broker/server/base/answer_stamps.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/session/fence_watch.hpp"
#include "common/log.hpp"
#include "proto/futex.hpp"

namespace mpsshim::server {

Session::Session(const Gpu& gpu, GreenContextPool& green_pool, IpcRegistry& ipc, ClientInfo info)
    // Salting the ids with the client id keeps one client's ids from naming another's objects.
    : client(std::move(info)),
      objects(client.id * 0x9E3779B1u),
      gpu_(&gpu),
      green_pool_(&green_pool),
      ipc_(&ipc) {}

std::string Session::who() const {
  return fmt::format("client {} (pid {}, {})", client.id, client.pid, client.program);
}

void Session::answer(std::uint32_t slot, CUresult result, std::span<const std::byte> payload,
                     std::uint64_t taken_ns, std::uint64_t known_ns) {
  if (slot >= segment.geometry().slot_count) return;
  proto::ResponseSlot* s = segment.view().slot(slot);
  std::size_t n = std::min<std::size_t>(payload.size(), proto::kSlotPayloadBytes);
  if (n != 0) std::memcpy(s->payload, payload.data(), n);
  s->payload_bytes = static_cast<std::uint32_t>(n);
  s->result = static_cast<std::int32_t>(result);
  if (answer_stamps_on()) {
    const std::uint64_t answered = SessionStats::now_ns();
    s->stamp_taken_ns = taken_ns != 0 ? taken_ns : answered;
    s->stamp_known_ns = known_ns != 0 ? known_ns : answered;
    s->stamp_launch_taken_ns = stamps.launch_taken_ns;
    s->stamp_launch_issued_ns = stamps.launch_issued_ns;
    s->stamp_answered_ns = answered;
  }
  if (slot < slot_busy.size()) slot_busy[slot] = 0;
  // seq_cst pairs with the waiter's "set waiter, re-check state": one of us sees the other.
  s->state.store(proto::kSlotReady, std::memory_order_seq_cst);
  if (s->waiter.load(std::memory_order_seq_cst) != 0) proto::futex_wake(&s->state);
}

void Session::finish_chunk(std::uint32_t chunk, std::uint32_t generation, CUresult result) {
  if (chunk >= segment.geometry().chunk_count) return;
  proto::ChunkState* c = segment.view().chunk_state(chunk);
  c->result.store(static_cast<std::int32_t>(result), std::memory_order_relaxed);
  c->done_generation.store(generation, std::memory_order_seq_cst);
  if (c->waiter.load(std::memory_order_seq_cst) != 0) proto::futex_wake(&c->done_generation);
}

void Session::post_async_error(CUresult result) {
  if (result == CUDA_SUCCESS) return;
  std::uint32_t expected = 0;
  control()->async_error.compare_exchange_strong(expected, static_cast<std::uint32_t>(result),
                                                 std::memory_order_acq_rel);
}

void Session::wake_everyone() {
  const proto::SegmentView& view = segment.view();
  for (std::uint32_t i = 0; i < view.geometry.slot_count; ++i)
    proto::futex_wake(&view.slot(i)->state);
  for (std::uint32_t i = 0; i < view.geometry.chunk_count; ++i) {
    proto::futex_wake(&view.chunk_state(i)->done_generation);
  }
  ring.wake_producer();
}

tl::expected<CUevent, CUresult> Session::create_event(unsigned flags) {
  const DriverTable& driver = cu();
  if (CUresult r = driver.cuCtxSetCurrent(green.context); r != CUDA_SUCCESS) {
    return tl::unexpected(r);
  }
  CUevent event = nullptr;
  // Interprocess events are shared inside this process (ipc_registry.hpp): the driver's own
  // interprocess machinery is not needed.
  CUresult r = driver.cuEventCreate(&event, flags & ~unsigned{CU_EVENT_INTERPROCESS});
  // Everything else the server does runs with the primary context current.
  driver.cuCtxSetCurrent(gpu_->primary);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  return event;
}

tl::expected<CUevent, CUresult> Session::acquire_event() {
  if (!event_pool.empty()) {
    CUevent event = event_pool.back();
    event_pool.pop_back();
    return event;
  }
  return create_event(CU_EVENT_DISABLE_TIMING);
}

void Session::release_event(CUevent event) {
  if (!destroy_if_stale(event)) event_pool.push_back(event);
}

bool Session::destroy_if_stale(CUevent event) {
  if (quota_changes.stale_events.empty() || std::erase(quota_changes.stale_events, event) == 0)
    return false;
  cu().cuEventDestroy_v2(event);
  return true;
}

CUresult Session::complete_after(CUstream stream, Completion completion) {
  // The client's answer comes after the span's end, never before it (busy_time.hpp).
  close_busy_span(*this, stream);
  if (CUresult r = fence_into(completion, stream); r != CUDA_SUCCESS) return r;
  complete_queued(std::move(completion));
  return CUDA_SUCCESS;
}

CUresult Session::complete_after(std::uint64_t id, StreamObj& stream, Completion completion) {
  close_busy_span(*this, stream.stream);
  if (CUresult r = fence_stream_into(completion, id, stream); r != CUDA_SUCCESS) return r;
  complete_queued(std::move(completion));
  return CUDA_SUCCESS;
}

CUresult Session::fence_stream_into(Completion& completion, std::uint64_t id, StreamObj& stream) {
  const bool latency_bound = stream.queued - stream.settled <= fences.max_queued;
  return fence_into(completion, stream.stream, latency_bound, id, stream.queued);
}

CUresult Session::fence_into(Completion& completion, CUstream stream, bool host_fence,
                             std::uint64_t id, std::uint64_t queued) {
  auto event = acquire_event();
  if (!event) return event.error();
  HostFence fence;
  if (fences.use_words && host_fence) {
    if (auto armed = fences.words.arm(cu(), stream)) {
      fence = *armed;
    } else {
      // Correct either way: its completions poll events from now on.
      fences.use_words = false;
      log_warn("{}: a host fence failed ({}); its completions poll the driver from now on", who(),
               describe(cu(), armed.error()));
    }
  }
  // Recorded after the fence's write: when the event has completed, the write has landed. (A
  // failed record leaves an armed word out of circulation until the session ends.)
  if (CUresult r = cu().cuEventRecordWithFlags(*event, stream, 0); r != CUDA_SUCCESS) {
    release_event(*event);
    return r;
  }
  if (fence.armed() && completion.waits.empty()) {
    completion.next_fault_check = std::chrono::steady_clock::now() + kFaultCheckInterval;
  }
  completion.waits.push_back({*event, Completion::Owner::kPool, fence, id, queued});
  priority_note_covered(*this, stream);
  return CUDA_SUCCESS;
}

void Session::complete_queued(Completion completion) {
  completion.taken_ns = stamps.record_taken_ns;
  if (completion.slot != proto::kNoReply && completion.slot < slot_busy.size()) {
    slot_busy[completion.slot] = 1;
  }
  pending.push_back(std::move(completion));
  post_early_watch(*this, pending.back());
}

tl::expected<std::vector<CUevent>, CUresult> Session::fence_all_streams() {
  std::vector<CUevent> fences;
  auto fail = [&](CUresult r) {
    for (CUevent e : fences) release_event(e);
    return tl::unexpected(r);
  };
  for (std::uint64_t id : objects.ids<StreamObj>()) {
    const StreamObj* stream = objects.get<StreamObj>(id);
    CUstream on = stream->stream;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (active_captures != 0) cu().cuStreamIsCapturing(stream->stream, &status);
    // An idle stream needs no fence. Skipping it also keeps the client's view exact: a record
    // of ours on a stream the client just synchronized would make its next cuStreamQuery
    // answer NOT_READY until the record ran. (Querying a capturing stream would invalidate
    // its capture, hence the check above first.)
    if (status == CU_STREAM_CAPTURE_STATUS_NONE && cu().cuStreamQuery(on) == CUDA_SUCCESS) {
      continue;
    }
    if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
      // A record would join the capture: fence what ran before it on a private stream.
      if (fence_stream == nullptr) {
        if (CUresult r =
                cu().cuGreenCtxStreamCreate(&fence_stream, green.green, CU_STREAM_NON_BLOCKING, 0);
            r != CUDA_SUCCESS) {
          return fail(r);
        }
      }
      on = fence_stream;
      if (stream->capture_fence != nullptr) {
        if (CUresult r = cu().cuStreamWaitEvent(on, stream->capture_fence, 0); r != CUDA_SUCCESS) {
          return fail(r);
        }
      }
    }
    auto event = acquire_event();
    if (!event) return fail(event.error());
    fences.push_back(*event);
    if (CUresult r = cu().cuEventRecordWithFlags(*event, on, 0); r != CUDA_SUCCESS) {
      return fail(r);
    }
  }
  return fences;
}

void Session::destroy_client_event(CUevent event) {
  bool waited_on = false;
  for (Completion& c : pending) {
    for (Completion::Wait& w : c.waits) {
      if (w.event == event && w.owner != Completion::Owner::kPool) {
        w.owner = Completion::Owner::kDestroy;
        waited_on = true;
      }
    }
  }
  if (!waited_on) cu().cuEventDestroy_v2(event);
}

}  // namespace mpsshim::server

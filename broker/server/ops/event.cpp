#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/streams.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// An interprocess event records into its driver event of this client's current green context
// (made on first use), which then becomes what every holder's waits and queries see.
OpResult record_interprocess(Call& call, IpcEvent& shared, const proto::EventRecordReq& req) {
  Session& session = call.session;
  CUevent driver_event = shared.in_context(session.green.context);
  if (driver_event == nullptr) {
    auto fresh = session.create_event(shared.flags());
    if (!fresh) return call.done(fresh.error());
    shared.adopt(session.green.context, *fresh);
    driver_event = *fresh;
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  close_busy_span(session, stream->stream);
  CUresult r = call.cu.cuEventRecordWithFlags(driver_event, stream->stream, req.flags);
  if (r == CUDA_SUCCESS) shared.recorded(driver_event);
  return finish_on_stream(call, *stream, r);
}

// The driver event a record of `event` goes into: made again when it dates from before a live
// SM quota change (an event records only on streams of its own green context; waits on its
// earlier record keep the old one: sm_quota_change.hpp).
tl::expected<CUevent, CUresult> event_to_record(Session& session, EventObj& event) {
  if (event.green_generation != session.quota_changes.generation) {
    auto fresh = session.create_event(event.flags);
    if (!fresh) return tl::unexpected(fresh.error());
    if (event.in_graph) {
      session.quota_changes.graph_events.push_back(event.event);  // a graph's node still names it
    } else {
      session.destroy_client_event(event.event);
    }
    event.event = *fresh;
    event.green_generation = session.quota_changes.generation;
  }
  return event.event;
}

}  // namespace

OpResult op_event_create(Call& call) {
  auto req = call.request<proto::EventCreateReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  // An interprocess event is shared with other clients of this server only once exported
  // (ops/ipc.cpp); the driver requires it without timing.
  if ((req.flags & CU_EVENT_INTERPROCESS) != 0 && (req.flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (!within_client_limit(session, ClientLimit::kEvents))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  auto event = session.create_event(req.flags);
  if (!event) return call.done(event.error());
  std::uint64_t id = session.objects.insert(
      EventObj{*event, req.ctx, req.flags, session.quota_changes.generation, {}});
  if (id == 0) {
    call.cu.cuEventDestroy_v2(*event);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::EventCreateRep{id});
}

OpResult op_event_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  auto event = call.session.objects.take<EventObj>(req.handle);
  if (!event) return call.done(CUDA_ERROR_INVALID_HANDLE);
  // An interprocess event's driver events go when its last holder lets go (~IpcEvent).
  if (!event->ipc) call.session.destroy_client_event(event->event);
  return call.done();
}

OpResult op_event_record(Call& call) {
  auto req = call.request<proto::EventRecordReq>();
  EventObj* event = call.session.objects.get<EventObj>(req.event);
  if (event == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (event->ipc) return record_interprocess(call, *event->ipc, req);
  auto driver_event = event_to_record(call.session, *event);
  if (!driver_event) return call.done(driver_event.error());
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  // The client may wait for its event: the span's end goes before it (busy_time.hpp).
  close_busy_span(call.session, stream->stream);
  return finish_on_stream(call, *stream,
                          call.cu.cuEventRecordWithFlags(*driver_event, stream->stream, req.flags));
}

// cuCtxRecordEvent: the event is recorded on a stream of the server's, after it waited for
// every stream of the context (their work so far), so that no stream of the client waits for
// another because of it. In a green context of the client's own that stream is kept with the
// context (ContextObj::record_stream), so that destroying the green context waits for the
// record too (retire.cpp); in the client's quota it is made for the call and goes once its work
// ran (the quota's green context outlives the session). cuCtxWaitEvent: every stream of
// the context, its default stream included, waits for the event (streams made later do not:
// they have no work before the call).
OpResult op_ctx_event(Call& call) {
  auto req = call.request<proto::CtxEventReq>();
  Session& session = call.session;
  ContextObj* ctx = session.objects.get<ContextObj>(req.ctx);
  if (ctx == nullptr) return call.done(CUDA_ERROR_INVALID_CONTEXT);
  EventObj* event = session.objects.get<EventObj>(req.event);
  if (event == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (req.wait > 1) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::vector<std::uint64_t> streams =
      session.objects.ids_where<StreamObj>([&](const StreamObj& s) { return s.ctx == req.ctx; });
  // While one of them captures, the driver refuses a context-wide operation and invalidates the
  // capture (H200: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, then the capture ends with
  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
  if (session.active_captures != 0) {
    CUresult refused = CUDA_SUCCESS;
    for (std::uint64_t id : streams) {
      StreamObj* stream = session.objects.get<StreamObj>(id);
      if (capturing(session, *stream)) refused = refuse_in_capture(session, *stream);
    }
    if (refused != CUDA_SUCCESS) return call.done(refused);
  }
  if (req.wait == 1) {
    const CUevent driver_event = event->driver_event();
    for (std::uint64_t id : streams) {
      CUresult error = CUDA_SUCCESS;
      StreamObj* stream = use_stream(call, id, true, &error);
      if (stream == nullptr) return call.done(error);
      close_busy_span(session, stream->stream);  // waiting is not busy time
      if (CUresult r = call.cu.cuStreamWaitEvent(stream->stream, driver_event, 0);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
    }
    return call.done();
  }
  if (event->ipc) {
    log_warn(
        "{}: cuCtxRecordEvent of an interprocess event is not supported by mpsshim; "
        "record it on a stream",
        session.who());
    return call.done(CUDA_ERROR_NOT_SUPPORTED);
  }
  auto driver_event = event_to_record(session, *event);
  if (!driver_event) return call.done(driver_event.error());
  // A green context of the client's own records from a stream of its own SMs.
  const bool kept = ctx->green != nullptr;
  StreamObj joined;
  joined.stream = kept ? ctx->record_stream : nullptr;
  if (joined.stream == nullptr) {
    if (CUresult r = call.cu.cuGreenCtxStreamCreate(
            &joined.stream, kept ? ctx->green : session.green.green, CU_STREAM_NON_BLOCKING, 0);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
    if (kept) ctx->record_stream = joined.stream;
  }
  CUresult r = CUDA_SUCCESS;
  for (std::uint64_t id : streams) {
    StreamObj* stream = session.objects.get<StreamObj>(id);
    r = join_streams(session, *stream, joined);
    if (r != CUDA_SUCCESS) break;
  }
  if (r == CUDA_SUCCESS) r = call.cu.cuEventRecordWithFlags(*driver_event, joined.stream, 0);
  // Destroying a stream with queued work is allowed: the driver lets it go once the work ran.
  if (!kept) call.cu.cuStreamDestroy_v2(joined.stream);
  return call.done(r);
}

OpResult op_event_query(Call& call) {
  auto req = call.request<proto::HandleReq>();
  const EventObj* event = call.session.objects.get<EventObj>(req.handle);
  if (event == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  return call.done(call.cu.cuEventQuery(event->driver_event()));
}

OpResult op_event_synchronize(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const EventObj* event = session.objects.get<EventObj>(req.handle);
  if (event == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  Completion completion;
  completion.slot = call.header.reply_slot;
  completion.op = call.op();
  completion.waits.push_back({event->driver_event(), Completion::Owner::kClient});
  completion.keep_alive = event->ipc;  // another client may let go of it meanwhile
  if (completion.slot < session.slot_busy.size()) session.slot_busy[completion.slot] = 1;
  session.pending.push_back(std::move(completion));
  return call.deferred();
}

OpResult op_event_elapsed_time(Call& call) {
  auto req = call.request<proto::ElapsedReq>();
  const EventObj* start = call.session.objects.get<EventObj>(req.start);
  const EventObj* end = call.session.objects.get<EventObj>(req.end);
  if (start == nullptr || end == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  float ms = 0.0f;
  if (CUresult r = call.cu.cuEventElapsedTime_v2(&ms, start->driver_event(), end->driver_event());
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::ElapsedRep{ms, 0});
}

}  // namespace mpsshim::server

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/limit_check.hpp"

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
  std::uint64_t id =
      session.objects.insert(EventObj{*event, req.ctx, req.flags, session.green_generation, {}});
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
  if (event->green_generation != call.session.green_generation) {
    // Made before a live SM quota change: an event records only on streams of its own green
    // context, so it gets a fresh one; waits on its earlier record keep the old one
    // (sm_quota_change.hpp).
    auto fresh = call.session.create_event(event->flags);
    if (!fresh) return call.done(fresh.error());
    if (event->in_graph) {
      call.session.graph_events.push_back(event->event);  // a graph's node still names it
    } else {
      call.session.destroy_client_event(event->event);
    }
    event->event = *fresh;
    event->green_generation = call.session.green_generation;
  }
  CUevent driver_event = event->event;
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  // The client may wait for its event: the span's end goes before it (busy_time.hpp).
  close_busy_span(call.session, stream->stream);
  return finish_on_stream(call, *stream,
                          call.cu.cuEventRecordWithFlags(driver_event, stream->stream, req.flags));
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

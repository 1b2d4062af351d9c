#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"
#include "broker/server/session/streams.hpp"

namespace mpsshim::server {

OpResult op_stream_create(Call& call) {
  auto req = call.request<proto::StreamCreateReq>();
  Session& session = call.session;
  ContextObj* ctx = session.objects.get<ContextObj>(req.ctx);
  if (ctx == nullptr) return call.done(CUDA_ERROR_INVALID_CONTEXT);
  if ((req.flags & ~static_cast<std::uint32_t>(CU_STREAM_NON_BLOCKING)) != 0) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (!within_client_limit(session, ClientLimit::kStreams))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  // Every real stream is non-blocking: the legacy ordering of blocking streams is emulated
  // among the client's own streams (streams.hpp), never through the real NULL stream.
  CUstream stream = nullptr;
  const int priority = effective_priority(session, req.priority);
  CUgreenCtx green = ctx->green != nullptr ? ctx->green : session.green.green;
  if (CUresult r = call.cu.cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, priority);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  StreamObj object;
  object.stream = stream;
  object.ctx = req.ctx;
  object.priority = priority;
  object.blocking = (req.flags & CU_STREAM_NON_BLOCKING) == 0;
  object.in_client_green = ctx->green != nullptr;
  std::uint64_t id = session.objects.insert(object);
  if (id == 0) {
    call.cu.cuStreamDestroy_v2(stream);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  if (object.blocking) ctx->blocking_streams.push_back(id);
  return call.reply(proto::StreamCreateRep{id});
}

OpResult op_stream_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const StreamObj* stream = session.objects.get<StreamObj>(req.handle);
  // The default stream lives and dies with its context.
  if (stream == nullptr || stream->is_default) return call.done(CUDA_ERROR_INVALID_HANDLE);
  destroy_stream(session, req.handle);
  return call.done();
}

OpResult op_stream_query(Call& call) {
  auto req = call.request<proto::HandleReq>();
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.handle, false, &error);
  if (stream == nullptr) return call.done(error);
  CUresult r = call.cu.cuStreamQuery(stream->stream);
  // Everything the client queued is known done (StreamObj::settled): idle, as natively right
  // after a synchronize, even if the driver still sees the server's own fence behind the
  // client's work (a host fence's word lands before the event recorded after it, and a client
  // spinning on its synchronize asks in that very window). Errors, sticky ones above all,
  // still come from the driver.
  if (r == CUDA_ERROR_NOT_READY && stream->idle()) r = CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) stream->settled = stream->queued;
  return call.done(r);
}

OpResult op_stream_synchronize(Call& call) {
  auto req = call.request<proto::HandleReq>();
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.handle, false, &error);
  if (stream == nullptr) return call.done(error);
  if (capturing(call.session, *stream)) return call.done(refuse_in_capture(call.session, *stream));
  Completion completion;
  completion.slot = call.header.reply_slot;
  completion.op = call.op();
  // A stream known idle needs no fence: answered at this pass's poll, after the session's
  // earlier completions (StreamObj::settled).
  if (stream->idle()) {
    call.session.complete_queued(std::move(completion));
    return call.deferred();
  }
  if (CUresult r = call.session.complete_after(req.handle, *stream, std::move(completion));
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.deferred();
}

OpResult op_stream_wait_event(Call& call) {
  auto req = call.request<proto::StreamWaitEventReq>();
  const EventObj* event = call.session.objects.get<EventObj>(req.event);
  if (event == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUevent driver_event = event->driver_event();
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  close_busy_span(call.session, stream->stream);  // waiting is not busy time
  // The wait may make the stream join a capture: fences then stand in with the work before it.
  const bool may_join = call.session.active_captures != 0 && !capturing(call.session, *stream);
  if (may_join) {
    if (CUresult r = mark_capture_fence(call.session, *stream); r != CUDA_SUCCESS) {
      return call.done(r);
    }
  }
  CUresult r = call.cu.cuStreamWaitEvent(stream->stream, driver_event, req.flags);
  if (may_join) release_capture_fences(call.session);
  return finish_on_stream(call, *stream, r);
}

}  // namespace mpsshim::server

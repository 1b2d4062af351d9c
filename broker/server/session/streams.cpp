#include "broker/server/session/streams.hpp"

#include "broker/server/session/busy_time.hpp"

namespace mpsshim::server {

CUresult join_streams(Session& session, StreamObj& from, StreamObj& to) {
  if (from.join_event == nullptr) {
    auto event = session.create_event(CU_EVENT_DISABLE_TIMING);
    if (!event) return event.error();
    from.join_event = *event;
  }
  const DriverTable& cu = session.cu();
  if (CUresult r = cu.cuEventRecordWithFlags(from.join_event, from.stream, 0); r != CUDA_SUCCESS) {
    return r;
  }
  close_busy_span(session, to.stream);  // waiting is not busy time
  return cu.cuStreamWaitEvent(to.stream, from.join_event, 0);
}

CUresult order_before(Session& session, StreamObj& stream) {
  ContextObj* ctx = session.objects.get<ContextObj>(stream.ctx);
  if (ctx == nullptr) return CUDA_SUCCESS;
  if (stream.is_default) {
    for (std::uint64_t id : ctx->blocking_streams) {
      StreamObj* blocking = session.objects.get<StreamObj>(id);
      if (blocking == nullptr || !blocking->work_since_join) continue;
      if (CUresult r = join_streams(session, *blocking, stream); r != CUDA_SUCCESS) return r;
      blocking->work_since_join = false;
    }
  } else if (stream.blocking && stream.joined_epoch != ctx->default_epoch) {
    StreamObj* default_stream = session.objects.get<StreamObj>(ctx->default_stream);
    if (default_stream != nullptr) {
      if (CUresult r = join_streams(session, *default_stream, stream); r != CUDA_SUCCESS) return r;
    }
    stream.joined_epoch = ctx->default_epoch;
  }
  return CUDA_SUCCESS;
}

void note_work(Session& session, StreamObj& stream) {
  if (stream.is_default) {
    if (ContextObj* ctx = session.objects.get<ContextObj>(stream.ctx)) ++ctx->default_epoch;
  } else if (stream.blocking) {
    stream.work_since_join = true;
  }
}

}  // namespace mpsshim::server

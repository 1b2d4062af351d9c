#include <algorithm>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"

namespace mpsshim::server {

OpResult op_goodbye(Call& call) {
  OpResult result = call.done();
  result.kind = OpResult::Kind::kEnd;
  result.why = "said goodbye";
  return result;
}

OpResult op_ping(Call& call) {
  return call.done();
}

OpResult op_ctx_create(Call& call) {
  auto req = call.request<proto::CtxCreateReq>();
  Session& session = call.session;
  if (!within_client_limit(session, ClientLimit::kStreams))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  CUstream stream = nullptr;
  // Nothing runs on the real NULL stream: the context's default stream is a stream of the
  // client's green context like any other.
  if (CUresult r = call.cu.cuGreenCtxStreamCreate(
          &stream, session.green.green, CU_STREAM_NON_BLOCKING, effective_priority(session, 0));
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::uint64_t ctx_id = session.objects.insert(ContextObj{req.flags, 0, 0, {}});
  StreamObj default_stream;
  default_stream.stream = stream;
  default_stream.ctx = ctx_id;
  default_stream.is_default = true;
  default_stream.priority = effective_priority(session, 0);
  std::uint64_t stream_id = ctx_id == 0 ? 0 : session.objects.insert(default_stream);
  if (stream_id == 0) {
    call.cu.cuStreamDestroy_v2(stream);
    if (ctx_id != 0) session.objects.take<ContextObj>(ctx_id);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  session.objects.get<ContextObj>(ctx_id)->default_stream = stream_id;
  return call.reply(proto::CtxCreateRep{ctx_id, stream_id});
}

OpResult op_ctx_destroy(Call& call) {
  auto req = call.request<proto::CtxReq>();
  if (call.session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  return call.done(retire_context(call.session, req.ctx));
}

OpResult op_ctx_synchronize(Call& call) {
  auto req = call.request<proto::CtxReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  // Synchronizing the context while one of its streams captures fails as the stream's would.
  if (session.active_captures != 0) {
    CUresult refused = CUDA_SUCCESS;
    for (std::uint64_t id : session.objects.ids_where<StreamObj>(
             [&](const StreamObj& s) { return s.ctx == req.ctx; })) {
      StreamObj* s = session.objects.get<StreamObj>(id);
      if (capturing(session, *s)) refused = refuse_in_capture(session, *s);
    }
    if (refused != CUDA_SUCCESS) return call.done(refused);
  }
  close_busy_spans(session);  // the answer comes after the spans' ends (busy_time.hpp)
  Completion completion;
  completion.slot = call.header.reply_slot;
  completion.op = call.op();
  auto give_back = [&] {
    for (const Completion::Wait& w : completion.waits) session.release_event(w.event);
  };
  for (std::uint64_t id :
       session.objects.ids_where<StreamObj>([&](const StreamObj& s) { return s.ctx == req.ctx; })) {
    // A stream known idle needs no fence (no stream captures here: refused above). With every
    // stream idle the answer goes out in this pass, without a driver call (StreamObj::settled).
    StreamObj* stream = session.objects.get<StreamObj>(id);
    if (stream->idle()) continue;
    if (CUresult r = session.fence_stream_into(completion, id, *stream); r != CUDA_SUCCESS) {
      give_back();
      return call.done(r);
    }
  }
  session.complete_queued(std::move(completion));
  return call.deferred();
}

namespace {

// The limits live in the primary context, which every client shares: a client may raise
// them for its kernels but never lower them under another client's running kernels, and the
// others (L2 persistence, device-runtime depths) are device-wide policy, not the client's.
bool client_may_set(CUlimit limit) {
  return limit == CU_LIMIT_STACK_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE ||
         limit == CU_LIMIT_MALLOC_HEAP_SIZE;
}

}  // namespace

OpResult op_ctx_set_limit(Call& call) {
  auto req = call.request<proto::CtxLimitReq>();
  auto limit = static_cast<CUlimit>(req.limit);
  if (!client_may_set(limit)) return call.done(CUDA_ERROR_NOT_SUPPORTED);
  std::size_t current = 0;
  if (CUresult r = call.cu.cuCtxGetLimit(&current, limit); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (req.value <= current) return call.done();
  return call.done(call.cu.cuCtxSetLimit(limit, static_cast<std::size_t>(req.value)));
}

OpResult op_ctx_get_limit(Call& call) {
  auto req = call.request<proto::CtxLimitReq>();
  if (req.limit >= CU_LIMIT_MAX) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::size_t value = 0;
  if (CUresult r = call.cu.cuCtxGetLimit(&value, static_cast<CUlimit>(req.limit));
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::CtxLimitRep{value});
}

}  // namespace mpsshim::server

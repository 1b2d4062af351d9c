// Streams and events. Creation and queries wait for the server; records, waits and destroys
// are one-way. Synchronization is answered by the server from a completion, never by blocking
// its loop.
#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/capture.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/object_pool.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

std::atomic<std::uint64_t> g_next_stream_id{1};

CUresult create_stream_in(Context* ctx, CUstream* out, unsigned flags, int priority) {
  if (out == nullptr || (flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::StreamCreateReq request{ctx->wire, flags, priority};
  proto::StreamCreateRep reply{};
  if (CUresult rc = ctx->session->call(proto::Op::kStreamCreate, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  Stream* stream = ObjectPool<Stream>::instance().make();
  stream->ctx = ctx;
  stream->wire = reply.stream;
  stream->flags = flags;
  stream->priority = priority;
  stream->id = g_next_stream_id.fetch_add(1);
  *out = reinterpret_cast<CUstream>(stream);
  return CUDA_SUCCESS;
}

CUresult create_stream(CUstream* out, unsigned flags, int priority) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  return create_stream_in(ctx, out, flags, priority);
}

CUresult stream_call(CUstream handle, DefaultStream mode, proto::Op op, bool report_async) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  CUresult rc = ctx->session->call(op, proto::HandleReq{stream->wire}, static_cast<int*>(nullptr));
  if (!report_async) return rc;
  CUresult async = ctx->session->take_async_error();
  return rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY ? rc : (async ? async : rc);
}

CUresult wait_event(CUstream handle, CUevent hevent, unsigned flags, DefaultStream mode) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  Event* event = object_of<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (event->ctx->session != ctx->session) {
    // An event of another GPU, whose server is another process: this thread waits for it
    // instead, which orders the stream's later work after it as the driver would (and holds
    // the caller until then, which the driver would not).
    if (event->ctx->device == ctx->device) return CUDA_ERROR_INVALID_HANDLE;
    return cuEventSynchronize(hevent);
  }
  proto::StreamWaitEventReq request{stream->wire, event->wire, flags, 0};
  return ctx->session->post(proto::Op::kStreamWaitEvent, request);
}

CUresult record_event(CUevent hevent, CUstream handle, unsigned flags, DefaultStream mode) {
  Event* event = object_of<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (event->ctx->session != ctx->session) return CUDA_ERROR_INVALID_HANDLE;
  proto::EventRecordReq request{event->wire, stream->wire, flags, 0};
  // Another process may wait on an interprocess event as soon as this returns (it tells it so
  // through its own channel): the record must be issued by then, so it is a round trip.
  if ((event->flags & CU_EVENT_INTERPROCESS) != 0) {
    return ctx->session->call(proto::Op::kEventRecord, request, static_cast<int*>(nullptr));
  }
  return ctx->session->post(proto::Op::kEventRecord, request);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* out, unsigned int flags) {
  return create_stream(out, flags, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* out, unsigned int flags,
                                                           int priority) {
  return create_stream(out, flags, priority);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Stream* stream = object_of<Stream>(handle);
  if (stream == nullptr || stream == &stream->ctx->legacy) return CUDA_ERROR_INVALID_HANDLE;
  // Work already queued still runs: the server destroys the stream after it (as CUDA does).
  CUresult rc =
      stream->ctx->session->post(proto::Op::kStreamDestroy, proto::HandleReq{stream->wire});
  forget_capture_origin(stream);
  ObjectPool<Stream>::instance().retire(stream);
  return rc;
}

// The green context of a stream made in one of the client's own (cuGreenCtxStreamCreate, or
// cuStreamCreate while its CUcontext was current); NULL for a stream of a regular context, as
// natively (the server's green context of the client's quota is not the client's).
MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetGreenCtx(CUstream handle, CUgreenCtx* green) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, DefaultStream::kLegacy, ctx, stream);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *green = ctx->green;
  return CUDA_SUCCESS;
}

namespace {

// cuStreamGetCtx_v2: a green context's stream names the green context and its device's primary
// context; another stream its context and no green context. CU_STREAM_PER_THREAD while a green
// context is current is an invalid handle, as natively.
CUresult stream_contexts(CUstream handle, DefaultStream mode, CUcontext* pctx, CUgreenCtx* pgreen) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  const bool per_thread =
      handle == CU_STREAM_PER_THREAD || (handle == nullptr && mode == DefaultStream::kPerThread);
  Context* ctx = nullptr;
  if (per_thread) {
    // Refused before the per-thread stream would be made for nothing.
    if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
    if (ctx->green != nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr || pgreen == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ctx->green == nullptr) {
    *pctx = reinterpret_cast<CUcontext>(ctx);
    *pgreen = nullptr;
    return CUDA_SUCCESS;
  }
  // The primary context's handle, without activating it on the server.
  if (CUresult rc = primary_context_handle(ctx->device, pctx); rc != CUDA_SUCCESS) return rc;
  *pgreen = ctx->green;
  return CUDA_SUCCESS;
}

}  // namespace

// Natively the flags must be CU_STREAM_NON_BLOCKING.
MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* out, CUgreenCtx handle,
                                                       unsigned int flags, int priority) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  return create_stream_in(&green->ctx, out, flags, priority);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream handle) {
  return cuStreamDestroy_v2(handle);
}

#define MPSSHIM_STREAM_ENTRIES(SUFFIX, MODE)                                                  \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamQuery##SUFFIX(CUstream h) {                         \
    return stream_call(h, MODE, proto::Op::kStreamQuery, false);                              \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamSynchronize##SUFFIX(CUstream h) {                   \
    return stream_call(h, MODE, proto::Op::kStreamSynchronize, true);                         \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamWaitEvent##SUFFIX(CUstream h, CUevent e,            \
                                                            unsigned int flags) {             \
    return wait_event(h, e, flags, MODE);                                                     \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuEventRecord##SUFFIX(CUevent e, CUstream h) {              \
    return record_event(e, h, 0, MODE);                                                       \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuEventRecordWithFlags##SUFFIX(CUevent e, CUstream h,       \
                                                                 unsigned int flags) {        \
    return record_event(e, h, flags, MODE);                                                   \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetFlags##SUFFIX(CUstream h, unsigned int* flags) { \
    Context* ctx = nullptr;                                                                   \
    Stream* s = nullptr;                                                                      \
    if (CUresult rc = resolve_stream(h, MODE, ctx, s); rc != CUDA_SUCCESS) return rc;         \
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;                                    \
    *flags = s->flags;                                                                        \
    return CUDA_SUCCESS;                                                                      \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetPriority##SUFFIX(CUstream h, int* priority) {    \
    Context* ctx = nullptr;                                                                   \
    Stream* s = nullptr;                                                                      \
    if (CUresult rc = resolve_stream(h, MODE, ctx, s); rc != CUDA_SUCCESS) return rc;         \
    if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;                                 \
    *priority = s->priority;                                                                  \
    return CUDA_SUCCESS;                                                                      \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetCtx##SUFFIX(CUstream h, CUcontext* pctx) {       \
    Context* ctx = nullptr;                                                                   \
    Stream* s = nullptr;                                                                      \
    if (CUresult rc = resolve_stream(h, MODE, ctx, s); rc != CUDA_SUCCESS) return rc;         \
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;                                     \
    *pctx = reinterpret_cast<CUcontext>(ctx);                                                 \
    return CUDA_SUCCESS;                                                                      \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetCtx_v2##SUFFIX(CUstream h, CUcontext* pctx,      \
                                                            CUgreenCtx* pgreen) {             \
    return stream_contexts(h, MODE, pctx, pgreen);                                            \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetId##SUFFIX(CUstream h, unsigned long long* id) { \
    Context* ctx = nullptr;                                                                   \
    Stream* s = nullptr;                                                                      \
    if (CUresult rc = resolve_stream(h, MODE, ctx, s); rc != CUDA_SUCCESS) return rc;         \
    if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;                                       \
    *id = s->id;                                                                              \
    return CUDA_SUCCESS;                                                                      \
  }                                                                                           \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetDevice##SUFFIX(CUstream h, CUdevice* device) {   \
    Context* ctx = nullptr;                                                                   \
    Stream* s = nullptr;                                                                      \
    if (CUresult rc = resolve_stream(h, MODE, ctx, s); rc != CUDA_SUCCESS) return rc;         \
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;                                   \
    *device = ctx->device;                                                                    \
    return CUDA_SUCCESS;                                                                      \
  }
// cuStreamIsCapturing and the rest of stream capture: graph.cpp.

MPSSHIM_STREAM_ENTRIES(, DefaultStream::kLegacy)
MPSSHIM_STREAM_ENTRIES(_ptsz, DefaultStream::kPerThread)
#undef MPSSHIM_STREAM_ENTRIES

// ---- events ----

MPSSHIM_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* out, unsigned int flags) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (out == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  // An interprocess event must not time (cuda.h); it is shared through cuIpcGetEventHandle.
  if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::EventCreateReq request{ctx->wire, flags, 0};
  proto::EventCreateRep reply{};
  if (CUresult rc = ctx->session->call(proto::Op::kEventCreate, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = reinterpret_cast<CUevent>(
      ObjectPool<Event>::instance().make(Magic::kEvent, ctx, reply.event, flags));
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Event* event = object_of<Event>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult rc = event->ctx->session->post(proto::Op::kEventDestroy, proto::HandleReq{event->wire});
  ObjectPool<Event>::instance().retire(event);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent handle) {
  return cuEventDestroy_v2(handle);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuEventQuery(CUevent handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Event* event = object_of<Event>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return event->ctx->session->call(proto::Op::kEventQuery, proto::HandleReq{event->wire},
                                   static_cast<int*>(nullptr));
}

MPSSHIM_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Event* event = object_of<Event>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Session* session = event->ctx->session;
  CUresult rc = session->call(proto::Op::kEventSynchronize, proto::HandleReq{event->wire},
                              static_cast<int*>(nullptr));
  CUresult async = session->take_async_error();
  return rc != CUDA_SUCCESS ? rc : async;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Event* a = object_of<Event>(start);
  Event* b = object_of<Event>(end);
  if (a == nullptr || b == nullptr || a->ctx->session != b->ctx->session) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ElapsedReq request{a->wire, b->wire};
  proto::ElapsedRep reply{};
  CUresult rc = a->ctx->session->call(proto::Op::kEventElapsedTime, request, &reply);
  if (rc == CUDA_SUCCESS) *ms = reply.milliseconds;
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime_v2(ms, start, end);
}

// cuCtxRecordEvent / cuCtxWaitEvent: every stream of the context at once, in one request to its
// server (broker/server/ops/event.cpp). Records are round trips, so that a refusal (a stream of
// the context capturing) comes back to the caller.
namespace {

CUresult context_event(CUcontext hctx, CUevent hevent, bool wait) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = object_of<Context>(hctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult rc = activate(ctx); rc != CUDA_SUCCESS) return rc;
  Event* event = object_of<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (event->ctx->session != ctx->session) {
    // An event of another GPU's server: the context's later work is ordered after it by this
    // thread waiting for it, as for a stream's wait (wait_event above); a record needs the
    // event's own GPU.
    if (!wait || event->ctx->device == ctx->device) return CUDA_ERROR_INVALID_HANDLE;
    return cuEventSynchronize(hevent);
  }
  proto::CtxEventReq request{ctx->wire, event->wire, wait ? 1u : 0u, 0};
  return ctx->session->call(proto::Op::kCtxEvent, request, static_cast<int*>(nullptr));
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxRecordEvent(CUcontext hctx, CUevent hevent) {
  return context_event(hctx, hevent, false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxWaitEvent(CUcontext hctx, CUevent hevent) {
  return context_event(hctx, hevent, true);
}

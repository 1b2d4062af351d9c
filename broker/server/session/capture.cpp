#include "broker/server/session/capture.hpp"

#include "broker/server/session/retire.hpp"

namespace mpsshim::server {

CUstreamCaptureStatus capture_status(Session& session, const StreamObj& stream) {
  if (session.active_captures == 0) return CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (session.cu().cuStreamIsCapturing(stream.stream, &status) != CUDA_SUCCESS) {
    return CU_STREAM_CAPTURE_STATUS_NONE;
  }
  return status;
}

CUresult refuse_in_capture(Session& session, StreamObj& stream) {
  if (capture_status(session, stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    session.cu().cuStreamQuery(stream.stream);
  }
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

bool blocking_stream_capturing(Session& session, std::uint64_t ctx_id) {
  if (session.active_captures == 0) return false;
  const ContextObj* ctx = session.objects.get<ContextObj>(ctx_id);
  if (ctx == nullptr) return false;
  for (std::uint64_t id : ctx->blocking_streams) {
    const StreamObj* s = session.objects.get<StreamObj>(id);
    if (s != nullptr && capturing(session, *s)) return true;
  }
  return false;
}

CUresult mark_capture_fence(Session& session, StreamObj& stream) {
  if (stream.capture_fence != nullptr) return CUDA_SUCCESS;
  auto event = session.acquire_event();
  if (!event) return event.error();
  if (CUresult r = session.cu().cuEventRecordWithFlags(*event, stream.stream, 0);
      r != CUDA_SUCCESS) {
    session.release_event(*event);
    return r;
  }
  stream.capture_fence = *event;
  return CUDA_SUCCESS;
}

void release_capture_fences(Session& session) {
  for (std::uint64_t id : session.objects.ids_where<StreamObj>(
           [](const StreamObj& s) { return s.capture_fence != nullptr; })) {
    StreamObj* s = session.objects.get<StreamObj>(id);
    if (capturing(session, *s)) continue;
    session.release_event(s->capture_fence);
    s->capture_fence = nullptr;
  }
}

void end_open_captures(Session& session) {
  if (session.active_captures == 0) return;
  for (std::uint64_t id :
       session.objects.ids_where<StreamObj>([](const StreamObj& s) { return s.capture_origin; })) {
    StreamObj* stream = session.objects.get<StreamObj>(id);
    CUgraph graph = nullptr;
    const CUresult r = session.cu().cuStreamEndCapture(stream->stream, &graph);
    stream->capture_origin = false;
    --session.active_captures;
    if (r != CUDA_SUCCESS || graph == nullptr) continue;  // the driver freed a graph it made
    // Ours to destroy unless it is a graph the client owns, which forget_graphs destroys.
    auto known = session.ids_by_driver_handle.find(graph);
    const GraphObj* g = known == session.ids_by_driver_handle.end()
                            ? nullptr
                            : session.objects.get<GraphObj>(known->second);
    if (g != nullptr && g->owned) continue;
    if (g != nullptr) forget_graph(session, known->second);  // the id the client saw; not owned
    session.cu().cuGraphDestroy(graph);
  }
}

}  // namespace mpsshim::server

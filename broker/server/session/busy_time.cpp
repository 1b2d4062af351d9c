#include "broker/server/session/busy_time.hpp"

#include <algorithm>

namespace mpsshim::server {
namespace {

tl::expected<CUevent, CUresult> acquire_timing_event(Session& session) {
  if (!session.busy.timing_pool.empty()) {
    CUevent event = session.busy.timing_pool.back();
    session.busy.timing_pool.pop_back();
    return event;
  }
  return session.create_event(CU_EVENT_DEFAULT);  // with timing: cuEventElapsedTime needs it
}

bool stream_captures(Session& session, CUstream stream) {
  if (session.active_captures == 0) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  session.cu().cuStreamIsCapturing(stream, &status);
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void release_timing_event(Session& session, CUevent event) {
  if (!session.destroy_if_stale(event)) session.busy.timing_pool.push_back(event);
}

BusySpans::Span* open_span_of(Session& session, CUstream stream) {
  for (BusySpans::Span& span : session.busy.open) {
    if (span.stream == stream) return &span;
  }
  return nullptr;
}

// Ends `span` (one of session.busy.open, removed by the caller).
void end_span(Session& session, BusySpans::Span span) {
  // A stream that began capturing since: a record would land in the client's graph. The begin
  // event is simply reused later; this span's work goes unmeasured.
  if (stream_captures(session, span.stream)) {
    session.busy.timing_pool.push_back(span.begin);
    return;
  }
  auto end = acquire_timing_event(session);
  if (!end) {
    session.busy.timing_pool.push_back(span.begin);
    return;
  }
  if (session.cu().cuEventRecordWithFlags(*end, span.stream, 0) != CUDA_SUCCESS) {
    session.busy.timing_pool.push_back(span.begin);
    session.busy.timing_pool.push_back(*end);
    return;
  }
  span.end = *end;
  session.busy.closed.push_back(span);
}

}  // namespace

void open_busy_span(Session& session, CUstream stream) {
  // Every stream that gets work in a pass passes here: the priority gate fences it at the end
  // of the pass (priority_gate.hpp).
  priority_note_stream(session, stream);
  // Off (the server's default): no span ever opens, so nothing else here does any work.
  if (!session.busy.on) return;
  if (open_span_of(session, stream) != nullptr || stream_captures(session, stream)) return;
  auto begin = acquire_timing_event(session);
  if (!begin) return;  // not measured; the work itself goes ahead
  if (session.cu().cuEventRecordWithFlags(*begin, stream, 0) != CUDA_SUCCESS) {
    session.busy.timing_pool.push_back(*begin);
    return;
  }
  session.busy.open.push_back(BusySpans::Span{stream, *begin, nullptr});
}

void close_busy_span(Session& session, CUstream stream) {
  for (std::size_t i = 0; i < session.busy.open.size(); ++i) {
    if (session.busy.open[i].stream != stream) continue;
    BusySpans::Span span = session.busy.open[i];
    session.busy.open.erase(session.busy.open.begin() + static_cast<std::ptrdiff_t>(i));
    end_span(session, span);
    return;
  }
}

void close_busy_spans(Session& session) {
  std::vector<BusySpans::Span> open;
  open.swap(session.busy.open);
  for (const BusySpans::Span& span : open) end_span(session, span);
}

std::size_t poll_busy(Session& session) {
  const DriverTable& cu = session.cu();
  std::size_t done = 0;
  for (std::size_t i = 0; i < session.busy.closed.size();) {
    const BusySpans::Span span = session.busy.closed[i];
    CUresult r = cu.cuEventQuery(span.end);
    if (r == CUDA_ERROR_NOT_READY) {
      ++i;
      continue;
    }
    float ms = 0;
    // A failed span (a fault, which the completions report) adds nothing.
    if (r == CUDA_SUCCESS && cu.cuEventElapsedTime_v2(&ms, span.begin, span.end) == CUDA_SUCCESS &&
        ms > 0) {
      session.usage.busy_ns += static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6);
    }
    ++session.usage.busy_spans;
    release_timing_event(session, span.begin);
    release_timing_event(session, span.end);
    session.busy.closed.erase(session.busy.closed.begin() + static_cast<std::ptrdiff_t>(i));
    ++done;
  }
  return done;
}

void drop_busy(Session& session) {
  const DriverTable& cu = session.cu();
  for (const BusySpans::Span& span : session.busy.open) cu.cuEventDestroy_v2(span.begin);
  for (const BusySpans::Span& span : session.busy.closed) {
    cu.cuEventDestroy_v2(span.begin);
    cu.cuEventDestroy_v2(span.end);
  }
  for (CUevent event : session.busy.timing_pool) cu.cuEventDestroy_v2(event);
  session.busy.open.clear();
  session.busy.closed.clear();
  session.busy.timing_pool.clear();
}

}  // namespace mpsshim::server

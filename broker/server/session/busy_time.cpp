#include "broker/server/session/busy_time.hpp"

#include <algorithm>

namespace mpsshim::server {
namespace {

tl::expected<CUevent, CUresult> acquire_timing_event(Session& session) {
  if (!session.timing_pool.empty()) {
    CUevent event = session.timing_pool.back();
    session.timing_pool.pop_back();
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
  if (!session.destroy_if_stale(event)) session.timing_pool.push_back(event);
}

Session::BusySpan* open_span_of(Session& session, CUstream stream) {
  for (Session::BusySpan& span : session.busy_open) {
    if (span.stream == stream) return &span;
  }
  return nullptr;
}

// Ends `span` (one of session.busy_open, removed by the caller).
void end_span(Session& session, Session::BusySpan span) {
  // A stream that began capturing since: a record would land in the client's graph. The begin
  // event is simply reused later; this span's work goes unmeasured.
  if (stream_captures(session, span.stream)) {
    session.timing_pool.push_back(span.begin);
    return;
  }
  auto end = acquire_timing_event(session);
  if (!end) {
    session.timing_pool.push_back(span.begin);
    return;
  }
  if (session.cu().cuEventRecordWithFlags(*end, span.stream, 0) != CUDA_SUCCESS) {
    session.timing_pool.push_back(span.begin);
    session.timing_pool.push_back(*end);
    return;
  }
  span.end = *end;
  session.busy_closed.push_back(span);
}

}  // namespace

void open_busy_span(Session& session, CUstream stream) {
  // Every stream that gets work in a pass passes here: the priority gate fences it at the end
  // of the pass (priority_gate.hpp).
  priority_note_stream(session, stream);
  // Off (the server's default): no span ever opens, so nothing else here does any work.
  if (!session.measure_busy) return;
  if (open_span_of(session, stream) != nullptr || stream_captures(session, stream)) return;
  auto begin = acquire_timing_event(session);
  if (!begin) return;  // not measured; the work itself goes ahead
  if (session.cu().cuEventRecordWithFlags(*begin, stream, 0) != CUDA_SUCCESS) {
    session.timing_pool.push_back(*begin);
    return;
  }
  session.busy_open.push_back(Session::BusySpan{stream, *begin, nullptr});
}

void close_busy_span(Session& session, CUstream stream) {
  for (std::size_t i = 0; i < session.busy_open.size(); ++i) {
    if (session.busy_open[i].stream != stream) continue;
    Session::BusySpan span = session.busy_open[i];
    session.busy_open.erase(session.busy_open.begin() + static_cast<std::ptrdiff_t>(i));
    end_span(session, span);
    return;
  }
}

void close_busy_spans(Session& session) {
  std::vector<Session::BusySpan> open;
  open.swap(session.busy_open);
  for (const Session::BusySpan& span : open) end_span(session, span);
}

std::size_t poll_busy(Session& session) {
  const DriverTable& cu = session.cu();
  std::size_t done = 0;
  for (std::size_t i = 0; i < session.busy_closed.size();) {
    const Session::BusySpan span = session.busy_closed[i];
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
    session.busy_closed.erase(session.busy_closed.begin() + static_cast<std::ptrdiff_t>(i));
    ++done;
  }
  return done;
}

void drop_busy(Session& session) {
  const DriverTable& cu = session.cu();
  for (const Session::BusySpan& span : session.busy_open) cu.cuEventDestroy_v2(span.begin);
  for (const Session::BusySpan& span : session.busy_closed) {
    cu.cuEventDestroy_v2(span.begin);
    cu.cuEventDestroy_v2(span.end);
  }
  for (CUevent event : session.timing_pool) cu.cuEventDestroy_v2(event);
  session.busy_open.clear();
  session.busy_closed.clear();
  session.timing_pool.clear();
}

}  // namespace mpsshim::server

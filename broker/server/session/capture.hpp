// The server's side of stream capture. Capture happens on the client's real streams, so nothing
// the server adds to a stream for its own bookkeeping (completion events, fences, legacy-stream
// joins) may be issued on one while it captures: it would land in the client's graph.
#pragma once

#include <cuda.h>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// The driver's word on the stream; NONE without asking while the client has no capture open.
CUstreamCaptureStatus capture_status(Session& session, const StreamObj& stream);
inline bool capturing(Session& session, const StreamObj& stream) {
  return session.active_captures != 0 &&
         capture_status(session, stream) != CU_STREAM_CAPTURE_STATUS_NONE;
}

// For what cannot be captured (synchronization, staged copies, answers owed after GPU work):
// the capture is invalidated as the real driver does it (a query on a capturing stream
// invalidates it and returns without waiting) and the call gets
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
CUresult refuse_in_capture(Session& session, StreamObj& stream);

// True when a blocking stream of the context captures: its legacy default stream may then not
// be used (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
bool blocking_stream_capturing(Session& session, std::uint64_t ctx);

// Records the stream's capture fence (the work before it joins a capture) unless it has one.
CUresult mark_capture_fence(Session& session, StreamObj& stream);
// Gives back the fences of streams that no longer capture.
void release_capture_fences(Session& session);

// At the session's end, before its graphs are destroyed: ends every capture a stream of it began,
// so that no capture still fills a graph of the client's (cuStreamBeginCaptureToGraph) when that
// graph is destroyed. A graph that an ordinary capture made is destroyed here; the client's own
// graphs are left to forget_graphs.
void end_open_captures(Session& session);

}  // namespace mpsshim::server

// A client's GPU busy time, measured on the GPU: a pair of timing events around the client's
// work on each of its streams, and cuEventElapsedTime between them once the second completed.
//
// A span opens (its begin event is recorded) before the first kernel, copy, memset or graph
// launch a drain pass queues on a stream, and closes (its end event is recorded) at the end of
// the pass, and earlier before anything that makes the stream wait (an event wait, a legacy
// stream join, a host function) or that the client can wait on (its own event record, a
// synchronizing call's completion): waiting is not busy time, and a record of ours after the
// client's synchronization point would make its next cuStreamQuery answer NOT_READY. An event
// completes when the work queued before it did, so a span measures its work from the moment the
// stream could start it (the end of earlier work, or the record itself on an idle stream) to its
// end. Spans of different streams may overlap: busy time is summed over the client's streams.
// Work on a capturing stream is not run, so it opens no span.
//
// Cost: two cuEventRecord per stream and pass with work, one cuEventQuery and one
// cuEventElapsedTime per span when polled. Measured on an H100 (harness, ResNet-50 b1 x 8) that
// is a third of the aggregate throughput, so it is off unless the server runs with
// --busy-time on (mpsshimd --busy-time on); Session::busy.on. Everything here is owned by
// the session's worker.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// Before queueing work on `stream`: opens a span unless one is open (or the stream captures).
void open_busy_span(Session& session, CUstream stream);
// Closes the stream's open span, if any: its end event goes after what is queued so far.
void close_busy_span(Session& session, CUstream stream);
// Closes every open span (the end of a drain pass).
void close_busy_spans(Session& session);
// Adds the elapsed time of every span whose end completed to session.usage.busy_ns.
std::size_t poll_busy(Session& session);
// Teardown (the client's streams are idle or destroyed): destroys every timing event.
void drop_busy(Session& session);

}  // namespace mpsshim::server

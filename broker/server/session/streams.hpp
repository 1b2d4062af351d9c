// Legacy default-stream semantics, emulated per client context without the real NULL stream
// (which would serialize every client): work on a blocking stream first waits for the default
// stream's earlier work; work on the default stream first waits for every blocking stream's
// earlier work. Non-blocking streams order with nothing.
#pragma once

#include <cuda.h>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// Makes `to` wait for everything queued on `from` so far (an event recorded on `from`).
CUresult join_streams(Session& session, StreamObj& from, StreamObj& to);

// Before an operation on `stream`: the waits the legacy stream would have implied.
CUresult order_before(Session& session, StreamObj& stream);

// After queueing work on `stream`: remember that others may have to wait for it.
void note_work(Session& session, StreamObj& stream);

}  // namespace mpsshim::server

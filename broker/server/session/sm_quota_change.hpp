// A running client's SM quota changed live (mpsshimctl set_active_thread_percentage): its later
// work runs in a green context of the new size; work already queued finishes where it is.
//
// Applied by the worker that owns the session (the operator's request reaches it as mail, run
// between two passes: the launch batch is empty then), at a safe point: with no stream capture
// open (a capture lives on the stream it began on; the change then waits until the client's last
// capture ends, checked after each drain pass). Each of the client's streams is replaced by a
// stream of the new green context with the same priority that first waits for an event
// recorded after everything the old stream holds, so the order within each stream is kept; the
// old stream is destroyed (its work still runs to its end). The client names its streams by id,
// so nothing changes on its side.
//
// What names the old green context keeps doing so: graphs the client instantiated before the
// change run their kernels where they were instantiated (instantiate again to move them), and
// its events get a fresh event of the new context at their next record (cuda.h has an event
// record only on streams of its own context), so cuEventElapsedTime between a record before the
// change and one after fails. The earlier green contexts live until the session ends; a change back
// to a shape the session had (the same percentage, in or out of the priority reserve) takes its
// green context up again instead of making another.
// CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT keeps answering the count the client started with:
// the shim answers it from the welcome, and a program sizes its grids once.
#pragma once

#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// On the session's worker: applies `percentage` (1-100) now, or notes it to apply when the
// client's captures end. A sentence for the operator, or why it could not be done (the client
// keeps its quota then).
tl::expected<std::string, std::string> change_sm_quota(Session& session, int percentage);

// After a drain pass: applies a change that waited for the client's captures to end.
void apply_pending_sm_quota(Session& session);

// On the session's worker, at a safe point with no capture open: the same move to the green
// context of `percentage` with or without the SMs reserved for normal-priority clients
// (priority_reserve.hpp); `why` goes into the log line. Nothing moves when the shape is the
// session's already.
tl::expected<std::string, std::string> move_sm_share(Session& session, int percentage,
                                                     bool outside_reserve, std::string_view why);

}  // namespace mpsshim::server

// A running client suspended and resumed by the operator (mpsshimctl suspend / resume), without
// the client's knowledge: suspended, its worker reads nothing more from its ring (its calls wait
// as on a busy GPU: a call that needs an answer blocks, and one-way calls queue until the ring is
// full), the work it issued before runs to its end, and then every block of device memory its
// cuMemAlloc, cuMemAllocPitch and stream-ordered allocations hold (DeviceHeap::park), and every
// physical allocation it made with cuMemCreate (vmm_park.hpp), is copied to pinned host memory and
// given back to the driver, its addresses kept. Resumed, the memory is put back at the same
// addresses with the same bytes and its ring is read again.
//
// Both run on the session's worker, in the operator's mail, between two passes (the launch batch
// is empty then). They take the worker for as long as the copies take: its other sessions wait
// meanwhile, and the server's coordinator waits for the answer.
//
// What cannot be parked is refused before anything changes, with the reason: memory another
// process may map (cuIpcGetMemHandle exports, blocks another GPU's server maps for peer access,
// physical allocations handed out as shareable handles), sparse-array tiles on its physical
// allocations, an open stream capture, and a server without an address arena (its memory could
// not come back at the same addresses). What stays on the GPU while suspended: its modules and
// their globals, graph memory (the driver's), physical allocations it imported from another
// process, its streams, events and green context.
#pragma once

#include <chrono>
#include <string>

#include <tl/expected.hpp>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// How long suspend waits for the work the client issued before it to finish.
inline constexpr std::chrono::seconds kSuspendWorkWait{30};

// On the session's worker. A sentence for the operator, or why nothing was done.
tl::expected<std::string, std::string> suspend_session(
    Session& session, std::chrono::milliseconds work_wait = kSuspendWorkWait);
tl::expected<std::string, std::string> resume_session(Session& session);

}  // namespace mpsshim::server

// Answers owed once GPU work completes: synchronizing calls, kFlagReplyWhenDone records,
// staging chunks, deferred frees. Polled by the server loop with cuEventQuery, so the server
// never blocks on one client's GPU work.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

struct PollOutcome {
  std::size_t fired = 0;           // completions answered, bundles freed
  CUresult sticky = CUDA_SUCCESS;  // a sticky error seen in completed work
  proto::Op sticky_op = proto::Op::kPad;
};

// Fires every completion of the session whose events have all completed.
PollOutcome poll_completions(Session& session);

// Frees every retired bundle whose fences have completed.
PollOutcome poll_retired(Session& session);

// Answers every owed slot and chunk with `result` now (fault, termination); the events are
// kept for teardown.
void abandon_completions(Session& session, CUresult result);

// Releases the events of every completion (teardown, after the client's streams are idle).
void drop_completions(Session& session);

}  // namespace mpsshim::server

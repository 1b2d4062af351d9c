#include "broker/server/completions.hpp"

#include <algorithm>

#include "broker/server/driver.hpp"
#include "broker/server/retire.hpp"

namespace mpsshim::server {
namespace {

// Queries waits from `done` on; true when all have completed.
bool advance(const DriverTable& cu, std::vector<Completion::Wait>& waits, std::size_t& done,
             CUresult& result) {
  while (done < waits.size()) {
    CUresult r = cu.cuEventQuery(waits[done].event);
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (r != CUDA_SUCCESS && result == CUDA_SUCCESS) result = r;
    ++done;
  }
  return true;
}

bool still_waited_on(const Session& session, const Completion* except, CUevent event) {
  for (const Completion& c : session.pending) {
    if (&c == except) continue;
    for (const Completion::Wait& w : c.waits) {
      if (w.event == event) return true;
    }
  }
  return false;
}

void release_waits(Session& session, Completion& c) {
  for (const Completion::Wait& w : c.waits) {
    switch (w.owner) {
      case Completion::Owner::kPool:
        session.release_event(w.event);
        break;
      case Completion::Owner::kClient:
        break;
      case Completion::Owner::kDestroy:
        if (!still_waited_on(session, &c, w.event)) session.cu().cuEventDestroy_v2(w.event);
        break;
    }
  }
  c.waits.clear();
}

void deliver(Session& session, const Completion& c, CUresult result) {
  // A one-way call (a staged copy) that failed on the GPU is reported at the client's next
  // synchronizing call; store it before releasing the chunk, which the client may be watching.
  if (c.slot == proto::kNoReply) session.post_async_error(result);
  if (c.chunk != Completion::kNoChunk) session.finish_chunk(c.chunk, c.generation, result);
  if (c.slot != proto::kNoReply) session.answer(c.slot, result);
}

}  // namespace

PollOutcome poll_completions(Session& session) {
  PollOutcome out;
  const DriverTable& cu = session.cu();
  for (std::size_t i = 0; i < session.pending.size();) {
    Completion& c = session.pending[i];
    if (!advance(cu, c.waits, c.done, c.result)) {
      ++i;
      continue;
    }
    if (is_sticky(c.result, true)) {
      // Not answered here: the server first stores the fault in every client's session, then
      // answers everything owed (abandon_completions), so no client sees the error as its own
      // call's alone.
      out.sticky = c.result;
      out.sticky_op = c.op;
      return out;
    }
    deliver(session, c, c.result);
    release_waits(session, c);
    session.pending.erase(session.pending.begin() + static_cast<std::ptrdiff_t>(i));
    ++out.fired;
  }
  return out;
}

PollOutcome poll_retired(Session& session) {
  PollOutcome out;
  const DriverTable& cu = session.cu();
  for (std::size_t i = 0; i < session.retiring.size();) {
    Retired& bundle = session.retiring[i];
    CUresult result = CUDA_SUCCESS;
    bool complete = true;
    while (bundle.fences_done < bundle.fences.size()) {
      CUresult r = cu.cuEventQuery(bundle.fences[bundle.fences_done]);
      if (r == CUDA_ERROR_NOT_READY) {
        complete = false;
        break;
      }
      if (r != CUDA_SUCCESS && result == CUDA_SUCCESS) result = r;
      ++bundle.fences_done;
    }
    if (is_sticky(result, true)) {  // nothing more is freed on a poisoned device
      out.sticky = result;
      return out;
    }
    if (!complete) {
      ++i;
      continue;
    }
    for (CUevent fence : bundle.fences) session.release_event(fence);
    bundle.fences.clear();
    free_retired(session, bundle);
    session.retiring.erase(session.retiring.begin() + static_cast<std::ptrdiff_t>(i));
    ++out.fired;
  }
  return out;
}

void abandon_completions(Session& session, CUresult result) {
  for (Completion& c : session.pending) {
    deliver(session, c, result);
    c.slot = proto::kNoReply;
    c.chunk = Completion::kNoChunk;
  }
}

void drop_completions(Session& session) {
  for (Completion& c : session.pending) release_waits(session, c);
  session.pending.clear();
}

}  // namespace mpsshim::server

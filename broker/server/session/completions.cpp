#include "broker/server/session/completions.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

#include "broker/server/base/answer_stamps.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/session/retire.hpp"

namespace mpsshim::server {
namespace {

using Clock = std::chrono::steady_clock;

// Advances the completion's waits from `done` on; true when all have completed. A wait on a
// host fence is over when its word holds the fence's value; its event is queried only after
// kFaultCheckInterval, then ever less often (fault_check_after), to learn of a fault that stops
// the stream before the write (host_fences.hpp); one without a fence every
// Session::fences.event_poll. `now` is read once per poll, when first needed.
bool advance(Session& session, Completion& c, std::optional<Clock::time_point>& now) {
  const DriverTable& cu = session.cu();
  while (c.done < c.waits.size()) {
    const Completion::Wait& w = c.waits[c.done];
    if (w.fence.armed()) {
      if (session.fences.words.reached(w.fence)) {
        ++c.done;
        continue;
      }
      if (!now) now = Clock::now();
      if (*now < c.next_fault_check) return false;
      c.next_fault_check = *now + fault_check_after(++c.fault_checks);
    } else if (session.fences.event_poll.count() != 0) {
      // At most every event_poll: each cuEventQuery holds a driver lock that the launches of
      // every other worker wait for, and a worker waiting for a long synchronize would
      // otherwise ask on every pass (~every 2 us).
      if (!now) now = Clock::now();
      if (*now < c.next_fault_check) return false;
      c.next_fault_check = *now + session.fences.event_poll;
    }
    CUresult r = cu.cuEventQuery(w.event);
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (r != CUDA_SUCCESS && c.result == CUDA_SUCCESS) c.result = r;
    ++c.done;
  }
  return true;
}

// The fenced client streams are idle up to their fences (StreamObj::settled).
void settle_streams(Session& session, const Completion& c) {
  for (const Completion::Wait& w : c.waits) {
    if (w.stream_id == 0) continue;
    if (StreamObj* stream = session.objects.get<StreamObj>(w.stream_id)) {
      stream->settled = std::max(stream->settled, w.stream_queued);
    }
  }
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
    // A word whose write may still be on its way stays out of circulation (host_fences.hpp).
    if (w.fence.armed() && session.fences.words.reached(w.fence))
      session.fences.words.release(w.fence);
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
  if (c.slot != proto::kNoReply) {
    session.answer(c.slot, result, {}, c.taken_ns, answer_stamps_on() ? SessionStats::now_ns() : 0);
  }
}

}  // namespace

PollOutcome poll_completions(Session& session) {
  PollOutcome out;
  std::optional<Clock::time_point> now;
  for (std::size_t i = 0; i < session.pending.size();) {
    Completion& c = session.pending[i];
    if (!advance(session, c, now)) {
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
    if (c.result == CUDA_SUCCESS) settle_streams(session, c);
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
  // A cuMemAlloc waiting for a memory policy is owed its answer as well.
  if (session.memory_wait.on) {
    session.memory_wait.on = false;
    session.answer(session.memory_wait.slot, result);
  }
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

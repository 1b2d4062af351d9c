#include "broker/server/scheduling/priority_gate.hpp"

#include <algorithm>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {
namespace {

using Clock = std::chrono::steady_clock;

bool is_set(Clock::time_point t) {
  return t != Clock::time_point{};
}

// Fences matter only while someone may wait for them: a normal session's tell the
// below-normal ones when it is idle, a below-normal session's how far ahead it runs.
bool fences_wanted(const Session& session, const PriorityBoard& board) {
  return session.priority.below_normal ? board.normal_sessions() > 0
                                       : board.below_normal_sessions() > 0;
}

bool is_live_stream(Session& session, CUstream stream) {
  for (std::uint64_t id : session.objects.ids<StreamObj>()) {
    if (session.objects.get<StreamObj>(id)->stream == stream) return true;
  }
  return false;
}

bool captures(Session& session, CUstream stream) {
  if (session.active_captures == 0) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  session.cu().cuStreamIsCapturing(stream, &status);
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// Drops the fences that completed; true when none is left. A host-fence word is read on every
// call (no driver call); events are asked about at most every `settings.fence_poll`, and
// between two asks an event not yet seen completed counts as running.
bool fences_done(Session& session, const PrioritySettings& settings, Clock::time_point now,
                 std::size_t* completed = nullptr) {
  PriorityState& p = session.priority;
  if (completed != nullptr) *completed = 0;
  if (p.fences.empty()) return true;
  bool ask_events = false;
  if (std::any_of(p.fences.begin(), p.fences.end(),
                  [](const auto& f) { return !f.word.armed(); })) {
    ask_events = !is_set(p.fences_asked) || now - p.fences_asked >= settings.fence_poll;
    if (ask_events) p.fences_asked = now;
  }
  std::size_t done = 0;
  for (std::size_t i = 0; i < p.fences.size();) {
    PriorityState::Fence& fence = p.fences[i];
    bool reached = false;
    if (fence.word.armed()) {
      reached = session.fences.words.reached(fence.word);
      if (reached) session.fences.words.release(fence.word);
    } else if (ask_events) {
      // An error here is a fault the completions report; the fence is done either way.
      reached = session.cu().cuEventQuery(fence.event) != CUDA_ERROR_NOT_READY;
      if (reached) session.release_event(fence.event);
    }
    if (!reached) {
      ++i;
      continue;
    }
    p.fences.erase(p.fences.begin() + static_cast<std::ptrdiff_t>(i));
    ++done;
  }
  if (completed != nullptr) *completed = done;
  return p.fences.empty();
}

void end_hold(PriorityState& p, Clock::time_point now) {
  if (!is_set(p.held_since)) return;
  p.held_us += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(now - p.held_since).count());
  p.held_since = {};
}

void count_busy(Session& session, PriorityBoard& board, bool busy) {
  PriorityState& p = session.priority;
  if (busy == p.counted_busy) return;
  p.counted_busy = busy;
  if (busy) {
    board.mark_busy();
  } else {
    board.mark_idle();
  }
}

}  // namespace

void PriorityBoard::joined(bool below_normal) {
  (below_normal ? below_normal_ : normal_).fetch_add(1, std::memory_order_relaxed);
  if (!below_normal) normal_changes_.fetch_add(1, std::memory_order_relaxed);
}

void PriorityBoard::left(bool below_normal) {
  (below_normal ? below_normal_ : normal_).fetch_sub(1, std::memory_order_relaxed);
  if (!below_normal) normal_changes_.fetch_add(1, std::memory_order_relaxed);
}

DrainPermit priority_permit(Session& session, PriorityBoard& board,
                            const PrioritySettings& settings, Clock::time_point now) {
  PriorityState& p = session.priority;
  if (!settings.enabled || !p.below_normal) return {};
  if (board.busy_normal() == 0) {
    end_hold(p, now);
    return {};
  }
  const bool earlier_done = fences_done(session, settings, now);
  const bool held_too_long = is_set(p.held_since) && now - p.held_since >= settings.max_hold;
  if (!earlier_done && !held_too_long) {
    if (!is_set(p.held_since)) {
      p.held_since = now;
      ++p.holds;
    }
    return DrainPermit{false, 0};
  }
  if (!earlier_done) ++p.released_by_bound;
  end_hold(p, now);
  return DrainPermit{true, std::max<std::size_t>(settings.run_ahead, 1)};
}

void priority_saw_work(Session& session, PriorityBoard& board) {
  PriorityState& p = session.priority;
  if (p.below_normal || board.below_normal_sessions() == 0) return;
  p.idle_since = {};
  count_busy(session, board, true);
}

void priority_note_stream(Session& session, CUstream stream) {
  std::vector<CUstream>& touched = session.priority.touched;
  if (std::find(touched.begin(), touched.end(), stream) == touched.end()) touched.push_back(stream);
}

void priority_note_covered(Session& session, CUstream stream) {
  // A below-normal session's fences also bound how far it runs ahead: kept.
  if (session.priority.below_normal) return;
  std::vector<CUstream>& touched = session.priority.touched;
  touched.erase(std::remove(touched.begin(), touched.end(), stream), touched.end());
}

void priority_end_pass(Session& session, const PriorityBoard& board) {
  PriorityState& p = session.priority;
  if (p.touched.empty()) return;
  std::vector<CUstream> touched;
  touched.swap(p.touched);
  if (!fences_wanted(session, board)) return;
  for (CUstream stream : touched) {
    // A stream the pass destroyed, or one that captures (a record would join the graph).
    if (!is_live_stream(session, stream) || captures(session, stream)) continue;
    // A word the GPU writes, read on every pass without a driver call: a held batch client's
    // worker that asked the driver (cuEventQuery) took the lock a latency client's launch waits
    // for, tens of thousands of times a second with four of them. Not while the server is
    // crowded: then the CPU bounds throughput, and the word's cuStreamWriteValue32 costs ~1.9 us
    // of driver CPU against ~0.2 us for an event's record (host_fences.hpp), on every pass of
    // every below-normal client beside a normal one; the events' queries are rate-limited.
    if (session.fences.use_words && !session.fences.crowded) {
      if (auto armed = session.fences.words.arm(session.cu(), stream)) {
        p.fences.push_back({*armed, nullptr});
        ++p.fenced;
        continue;
      }
    }
    auto event = session.acquire_event();
    if (!event) continue;  // not fenced: only the hold is less exact
    if (session.cu().cuEventRecordWithFlags(*event, stream, 0) != CUDA_SUCCESS) {
      session.release_event(*event);
      continue;
    }
    p.fences.push_back({HostFence{}, *event});
    ++p.fenced;
  }
}

std::size_t priority_poll(Session& session, PriorityBoard& board, const PrioritySettings& settings,
                          Clock::time_point now) {
  PriorityState& p = session.priority;
  if (p.fences.empty() && !p.counted_busy) return 0;
  std::size_t completed = 0;
  const bool all_done = fences_done(session, settings, now, &completed);
  if (p.below_normal || !p.counted_busy) return completed;
  const bool idle = all_done && session.pending_gpu_work() == 0 &&
                    session.ring.peek().status == proto::PeekStatus::kEmpty;
  if (!idle) {
    p.idle_since = {};
  } else if (!is_set(p.idle_since)) {
    p.idle_since = now;
  } else if (now - p.idle_since >= settings.linger || board.below_normal_sessions() == 0) {
    p.idle_since = {};
    count_busy(session, board, false);
  }
  return completed;
}

void priority_leave(Session& session, PriorityBoard& board) {
  PriorityState& p = session.priority;
  count_busy(session, board, false);
  for (const PriorityState::Fence& fence : p.fences) {
    if (!fence.word.armed()) {
      session.release_event(fence.event);
    } else if (session.fences.words.reached(fence.word)) {
      session.fences.words.release(fence.word);
    }  // else its write may still land: the word stays out of use until the pages go
  }
  p.fences.clear();
  p.touched.clear();
  board.left(p.below_normal);
}

}  // namespace mpsshim::server

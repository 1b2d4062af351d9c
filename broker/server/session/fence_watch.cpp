#include "broker/server/session/fence_watch.hpp"

#include <algorithm>
#include <atomic>

namespace mpsshim::server {

bool watchable(const Session& session, const Completion& c) {
  return c.slot != proto::kNoReply && c.slot < session.segment.geometry().slot_count &&
         c.chunk == Completion::kNoChunk && c.done + 1 == c.waits.size() &&
         session.fences.words.watched(c.waits.back().fence);
}

bool client_sleeps(const Session& session, const Completion& c) {
  return session.segment.view().slot(c.slot)->waiter.load(std::memory_order_seq_cst) != 0;
}

namespace {

// Names the fence of watchable `c` in its slot, once.
void name_fence(Session& session, const Completion& c) {
  const HostFence& fence = c.waits.back().fence;
  const std::uint64_t watch = proto::fence_watch(fence.word, fence.value);
  proto::ResponseSlot* slot = session.segment.view().slot(c.slot);
  if (slot->watch.load(std::memory_order_relaxed) == watch) return;
  // Ordered before the sleep's announcement by its seq_cst store.
  slot->watch.store(watch, std::memory_order_relaxed);
  ++session.stats.fence_watches;
}

}  // namespace

void post_watches(Session& session) {
  for (Completion& c : session.pending) {
    if (watchable(session, c)) name_fence(session, c);
  }
}

void post_early_watch(Session& session, const Completion& c) {
  // Landed, the last wait completes the answer with c.result (completions.cpp: deliver), with
  // no payload; a fault stops the stream before the fence's write.
  if (c.result == CUDA_SUCCESS && watchable(session, c)) name_fence(session, c);
}

void look_at_watches(const Session& session, WatchLook& look) {
  for (const Completion& c : session.pending) {
    if (!watchable(session, c)) {
      look.must_poll = true;
      continue;
    }
    if (session.fences.words.reached(c.waits.back().fence)) {
      look.landed = true;
      continue;
    }
    // The client went to sleep on its slot: nobody watches this fence.
    if (client_sleeps(session, c)) look.must_poll = true;
    look.fault_check =
        look.fault_check ? std::min(*look.fault_check, c.next_fault_check) : c.next_fault_check;
  }
}

void count_watch_wake(Session& session) {
  for (const Completion& c : session.pending) {
    if (watchable(session, c) && session.fences.words.reached(c.waits.back().fence)) {
      ++session.stats.watch_wakes;
      return;
    }
  }
}

}  // namespace mpsshim::server

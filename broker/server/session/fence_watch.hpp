// Fence watches: a client thread spinning for a synchronize watches the host fence that finishes
// it and rings the worker's doorbell when the fence lands, so the worker sleeps through the GPU's
// work instead of polling it every 100 us (each poll a wake-up, ~1 core per busy worker).
//
// The worker, about to park, names in each owed answer's slot the fence the client can watch
// (post_watches; ResponseSlot::watch), announces its sleep in the ring, then looks once more
// (look_at_watches): a fence that landed meanwhile means no sleep; a client that went to sleep
// itself (ResponseSlot::waiter) watches nothing, so the worker naps and polls as before. The
// client, spinning, rings when the named word holds the value and the ring says the worker sleeps;
// going to sleep, it rings if the worker sleeps, so the worker looks again. Both sides store, then
// fence, then load what the other stored: one of them always sees the other.
//
// Early answers (ABI 1.29): a completion whose answer will be CUDA_SUCCESS once its fence lands
// is named in its slot as soon as the answer is deferred (post_early_watch), and a spinning client
// returns when it sees the word land instead of waiting for the worker to see it and answer
// (~1 us less per synchronize on an H200: tools/probes/small_pinned_copies.cpp). The worker's
// answer still comes, later, and only then may the client use the slot again.
//
// Only the owning worker's thread calls these.
#pragma once

#include <chrono>
#include <optional>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// The client can watch what `c` still waits for: an answer to a slot, one wait left, on a fence
// of the session's watch page (host_fences.hpp).
bool watchable(const Session& session, const Completion& c);

// The client thread waiting for `c`'s answer sleeps on its slot (ResponseSlot::waiter): it
// watches nothing.
bool client_sleeps(const Session& session, const Completion& c);

// Names each watchable completion's fence in its slot.
void post_watches(Session& session);

// Names `c`'s fence in its slot now, when the client can watch it and its answer will be
// CUDA_SUCCESS once the fence lands: an early answer. `c` was just deferred.
void post_early_watch(Session& session, const Completion& c);

// What the worker found after announcing its sleep.
struct WatchLook {
  bool landed = false;     // a watched fence has landed: no sleep
  bool must_poll = false;  // a completion nobody watches (its client sleeps, or not watchable)
  std::optional<std::chrono::steady_clock::time_point> fault_check;  // the earliest one due
};
void look_at_watches(const Session& session, WatchLook& look);

// A doorbell of the session came while a watched fence of it had landed: counts it
// (SessionStats::watch_wakes).
void count_watch_wake(Session& session);

}  // namespace mpsshim::server

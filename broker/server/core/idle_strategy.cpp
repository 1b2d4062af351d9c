#include "broker/server/core/idle_strategy.hpp"

#include <sched.h>

#include <algorithm>

#include "proto/futex.hpp"

namespace mpsshim::server {

void BackoffIdleStrategy::end_spell(Clock::time_point now) {
  idle_ = false;
  if (spell_owed_nothing_) {
    trickling_spells_ = now - idle_since_ >= config_.doze_after
                            ? std::min(trickling_spells_ + 1, config_.doze_after_spells)
                            : 0;
  }
  if (!spell_watched_) return;
  // A spell that parked at once is judged as if it had spun: had work come back within the
  // spin and yield, spinning would have caught it.
  long_watched_spells_ = now - idle_since_ >= config_.yield
                             ? std::min(long_watched_spells_ + 1, config_.park_at_once_after)
                             : 0;
}

void BackoffIdleStrategy::idle(std::size_t work, GpuWait gpu, bool crowded, Parker& parker) {
  if (work != 0) {
    // The clock is read once per spell, not once per pass with work.
    if (idle_) end_spell(now_());
    return;
  }
  auto now = now_();
  if (!idle_) {
    idle_ = true;
    idle_since_ = now;
    spell_watched_ = gpu == GpuWait::kWatched;
    park_at_once_ = spell_watched_ && config_.park_at_once_after != 0 &&
                    long_watched_spells_ >= config_.park_at_once_after;
    spell_owed_nothing_ = gpu == GpuWait::kNone;
    dozed_ = false;
  }
  const bool polled = gpu == GpuWait::kPolled;
  if (polled && spell_watched_) {
    // A client went to sleep on its slot (a crowded server's clients do after 60 us): it
    // watches nothing, so no doorbell would end a spell that parked at once.
    spell_watched_ = false;
    long_watched_spells_ = 0;
  }
  auto idle_for = now - idle_since_;
  if (gpu == GpuWait::kNone && spell_owed_nothing_ && !dozed_ && config_.doze_after_spells != 0 &&
      trickling_spells_ >= config_.doze_after_spells && idle_for >= config_.doze_after) {
    dozed_ = true;
    if (parker.doze(config_.doze)) return;
  }
  // What is owed can change within a spell: it parks at once only while it owes nothing but
  // watched fences.
  if (!(park_at_once_ && gpu == GpuWait::kWatched)) {
    // A crowded server's polled spells wait at most crowded_pending_wait before their naps.
    const bool crowded_polled = polled && crowded;
    const auto spin =
        crowded_polled ? std::min(config_.spin, config_.crowded_pending_wait) : config_.spin;
    if (idle_for < spin) {
      proto::cpu_relax();
      return;
    }
    const auto yield = crowded_polled ? config_.crowded_pending_wait
                       : polled       ? config_.pending_yield
                                      : config_.yield;
    if (idle_for < yield) {
      ::sched_yield();
      return;
    }
  }
  parker.park(polled ? config_.pending_nap : std::chrono::nanoseconds(-1), config_.pending_nap);
}

}  // namespace mpsshim::server

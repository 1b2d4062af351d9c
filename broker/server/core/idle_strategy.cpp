#include "broker/server/core/idle_strategy.hpp"

#include <sched.h>

#include <algorithm>

#include "proto/futex.hpp"

namespace mpsshim::server {

void BackoffIdleStrategy::end_spell(Clock::time_point now) {
  idle_ = false;
  if (spell_kind_ == GpuWait::kNone) return;
  // A spell that parked at once is judged as if it had spun: had work come back within the
  // spin and yield, spinning would have caught it.
  unsigned& streak = long_spells_[static_cast<std::size_t>(spell_kind_)];
  streak = now - idle_since_ >= awake_for(spell_kind_)
               ? std::min(streak + 1, config_.park_at_once_after)
               : 0;
}

void BackoffIdleStrategy::idle(std::size_t work, GpuWait gpu, Parker& parker) {
  if (work != 0) {
    // The clock is read once per spell, not once per pass with work.
    if (idle_) end_spell(now_());
    return;
  }
  auto now = now_();
  if (!idle_) {
    idle_ = true;
    idle_since_ = now;
    spell_kind_ = gpu;
    const unsigned streak = long_spells_[static_cast<std::size_t>(gpu)];
    park_at_once_ = gpu != GpuWait::kNone && config_.park_at_once_after != 0 &&
                    streak >= config_.park_at_once_after;
  }
  const bool polled = gpu == GpuWait::kPolled;
  auto idle_for = now - idle_since_;
  // What is owed can change within a spell (an answer delivered, a poll's work found): the
  // spell parks at once only while it still owes what it began with.
  if (!(park_at_once_ && gpu == spell_kind_)) {
    if (idle_for < config_.spin) {
      proto::cpu_relax();
      return;
    }
    if (idle_for < awake_for(gpu)) {
      ::sched_yield();
      return;
    }
  }
  parker.park(polled ? config_.pending_nap : std::chrono::nanoseconds(-1), config_.pending_nap);
}

}  // namespace mpsshim::server

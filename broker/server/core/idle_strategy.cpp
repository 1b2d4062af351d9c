#include "broker/server/core/idle_strategy.hpp"

#include <sched.h>

#include "proto/futex.hpp"

namespace mpsshim::server {

void BackoffIdleStrategy::idle(std::size_t work, GpuWait gpu, Parker& parker) {
  if (work != 0) {
    idle_ = false;
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (!idle_) {
    idle_ = true;
    idle_since_ = now;
  }
  const bool polled = gpu == GpuWait::kPolled;
  auto idle_for = now - idle_since_;
  if (idle_for < config_.spin) {
    proto::cpu_relax();
    return;
  }
  if (idle_for < (polled ? config_.pending_yield : config_.yield)) {
    ::sched_yield();
    return;
  }
  parker.park(polled ? config_.pending_nap : std::chrono::nanoseconds(-1), config_.pending_nap);
}

}  // namespace mpsshim::server

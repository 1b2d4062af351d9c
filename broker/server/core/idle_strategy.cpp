#include "broker/server/core/idle_strategy.hpp"

#include <sched.h>

#include "proto/futex.hpp"

namespace mpsshim::server {

void BackoffIdleStrategy::idle(std::size_t work, bool gpu_pending, Parker& parker) {
  if (work != 0) {
    idle_ = false;
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (!idle_) {
    idle_ = true;
    idle_since_ = now;
  }
  auto idle_for = now - idle_since_;
  if (idle_for < config_.spin) {
    proto::cpu_relax();
    return;
  }
  if (idle_for < (gpu_pending ? config_.pending_yield : config_.yield)) {
    ::sched_yield();
    return;
  }
  parker.park(gpu_pending ? config_.pending_nap : std::chrono::nanoseconds(-1));
}

}  // namespace mpsshim::server

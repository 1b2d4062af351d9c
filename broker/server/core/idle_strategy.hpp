// What the server loop does when a pass found nothing to do (Aeron's idle strategies): spin
// briefly for the lowest hand-off latency, then yield the CPU, then park in the kernel until a
// client rings its doorbell. GPU completions cannot ring anything, so while some are owed the
// strategy only parks for short timeouts and keeps polling.
#pragma once

#include <chrono>
#include <cstddef>

namespace mpsshim::server {

class Parker {
 public:
  virtual ~Parker() = default;
  // Sleeps until something arrives for the loop, at most `timeout` (negative: no limit).
  virtual void park(std::chrono::nanoseconds timeout) = 0;
};

class IdleStrategy {
 public:
  virtual ~IdleStrategy() = default;
  // Called after every pass of the loop with the amount of work that pass did.
  virtual void idle(std::size_t work, bool gpu_pending, Parker& parker) = 0;
};

class BackoffIdleStrategy final : public IdleStrategy {
 public:
  struct Config {
    std::chrono::nanoseconds spin = std::chrono::microseconds(20);
    std::chrono::nanoseconds yield = std::chrono::microseconds(200);
    // While GPU work is owed: yield longer, then park in short naps between polls.
    std::chrono::nanoseconds pending_yield = std::chrono::milliseconds(1);
    std::chrono::nanoseconds pending_nap = std::chrono::microseconds(100);
  };

  BackoffIdleStrategy() = default;
  explicit BackoffIdleStrategy(Config config) : config_(config) {}

  void idle(std::size_t work, bool gpu_pending, Parker& parker) override;

 private:
  Config config_;
  bool idle_ = false;
  std::chrono::steady_clock::time_point idle_since_{};
};

}  // namespace mpsshim::server

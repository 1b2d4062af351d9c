#include "broker/server/scheduling/memory_arbiter.hpp"

namespace mpsshim::server {

void MemoryArbiter::want(const MemoryWant& want) {
  {
    std::lock_guard lock(mutex_);
    wants_.push_back(want);
    has_wants_.store(true, std::memory_order_release);
  }
  if (wake_) wake_();
}

std::vector<MemoryWant> MemoryArbiter::take_wants() {
  std::lock_guard lock(mutex_);
  std::vector<MemoryWant> taken;
  taken.swap(wants_);
  has_wants_.store(false, std::memory_order_release);
  return taken;
}

}  // namespace mpsshim::server

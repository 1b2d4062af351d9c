#include "broker/server/accounting/allocation_account.hpp"

#include <algorithm>

namespace mpsshim::server {

bool AllocationAccount::try_charge(std::uint64_t bytes) {
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (limit_ != 0 && (bytes > limit_ || used > limit_ - bytes)) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

void AllocationAccount::release(std::uint64_t bytes) {
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  while (
      !used_.compare_exchange_weak(used, used - std::min(used, bytes), std::memory_order_relaxed)) {
  }
}

}  // namespace mpsshim::server

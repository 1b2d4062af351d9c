#include "broker/server/session/memory_charge.hpp"

namespace mpsshim::server {

MemoryReservation::~MemoryReservation() {
  if (charge_ != nullptr) charge_->release(bytes_);
}

void MemoryReservation::keep() {
  if (charge_ == nullptr) return;
  // The peak is what the client held, not what it asked for and the driver refused.
  charge_->note_kept();
  charge_ = nullptr;
}

tl::expected<MemoryReservation, MemoryLimitHit> MemoryCharge::reserve(std::uint64_t bytes) {
  take_back_returned();
  // The allocation's limit first: a client of one is usually given that same limit as its own,
  // and the refusal should name the shared one.
  if (allocation_ && !allocation_->try_charge(bytes)) {
    return tl::unexpected(MemoryLimitHit::kAllocation);
  }
  if (over_limit(bytes)) {
    if (allocation_) allocation_->release(bytes);
    return tl::unexpected(MemoryLimitHit::kClient);
  }
  used_ += bytes;
  return MemoryReservation(*this, bytes);
}

void MemoryCharge::release(std::uint64_t bytes) {
  const std::uint64_t released = std::min(used_, bytes);
  used_ -= released;
  if (allocation_) allocation_->release(released);
}

void MemoryCharge::take_back_returned() {
  if (std::uint64_t back = returned_->bytes.exchange(0, std::memory_order_acq_rel); back != 0) {
    release(back);
  }
}

}  // namespace mpsshim::server

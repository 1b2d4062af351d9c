#include "broker/server/driver/park_pool.hpp"

#include <sys/mman.h>

#include <chrono>

#include "broker/server/driver/driver.hpp"
#include "broker/server/driver/parked_memory.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

constexpr std::uint64_t kRangeAlignment = std::uint64_t{2} << 20;

}  // namespace

void ParkPool::fill(CUcontext context) {
  if (capacity_ == 0 || filler_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    if (base_ != nullptr) return;
  }
  if (!host_can_hold(capacity_)) {
    // Asked again at every admission: said once until it fits.
    if (!refused_) {
      log_warn(
          "park pool: the host cannot hold {} more of page-locked memory; suspends get fresh "
          "memory until it can",
          format_bytes(capacity_));
    }
    refused_ = true;
    return;
  }
  refused_ = false;
  filler_ = std::thread([this, context] { prepare(context); });
}

void ParkPool::prepare(CUcontext context) {
  const auto start = std::chrono::steady_clock::now();
  void* host = map_huge_aligned(capacity_);
  if (host == nullptr) {
    log_warn("park pool: mapping {} failed; suspends get fresh memory each time",
             format_bytes(capacity_));
    return;
  }
  fault_in(static_cast<std::byte*>(host), capacity_);
  cu_.cuCtxSetCurrent(context);
  // One registration: a block's copy may then span any part of it.
  if (CUresult r = cu_.cuMemHostRegister_v2(host, capacity_, CU_MEMHOSTREGISTER_PORTABLE);
      r != CUDA_SUCCESS) {
    log_warn("park pool: registering {} failed: {}; suspends get fresh memory each time",
             format_bytes(capacity_), describe(cu_, r));
    ::munmap(host, capacity_);
    return;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("park pool: {} of page-locked host memory ready for suspends in {:.3f} s",
           format_bytes(capacity_), seconds);
  std::lock_guard lock(mutex_);
  base_ = static_cast<std::byte*>(host);
  ranges_ = std::make_unique<AddressArena>(reinterpret_cast<std::uint64_t>(host), capacity_);
}

void ParkPool::drain() {
  if (filler_.joinable()) filler_.join();
  std::lock_guard lock(mutex_);
  if (base_ == nullptr) return;
  if (ranges_->taken_bytes() != 0) {
    // Parked memory outlives only a server that ends with suspended clients: left to the exit.
    log_warn("park pool: {} still parked at release; kept", format_bytes(ranges_->taken_bytes()));
    return;
  }
  if (CUresult r = cu_.cuMemHostUnregister(base_); r != CUDA_SUCCESS) {
    log_warn("park pool: cuMemHostUnregister failed: {}", describe(cu_, r));
  }
  ::munmap(base_, capacity_);
  base_ = nullptr;
  ranges_.reset();
}

void* ParkPool::take(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (ranges_ == nullptr) return nullptr;
  auto at = ranges_->take(bytes, kRangeAlignment);
  return at ? reinterpret_cast<void*>(*at) : nullptr;
}

void ParkPool::give(void* host, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (ranges_ != nullptr) ranges_->give(reinterpret_cast<std::uint64_t>(host), bytes);
}

bool ParkPool::holds(const void* host) const {
  std::lock_guard lock(mutex_);
  return ranges_ != nullptr && ranges_->holds(reinterpret_cast<std::uint64_t>(host));
}

std::uint64_t ParkPool::available() const {
  std::lock_guard lock(mutex_);
  return ranges_ == nullptr ? 0 : capacity_ - ranges_->taken_bytes();
}

}  // namespace mpsshim::server

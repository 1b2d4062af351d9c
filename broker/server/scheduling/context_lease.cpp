#include "broker/server/scheduling/context_lease.hpp"

#include <fmt/format.h>

#include "common/log.hpp"

namespace mpsshim::server {

ContextLease::ContextLease(Gpu& gpu, GreenContextPool& green_pool,
                           std::chrono::milliseconds idle_timeout, ParkPool* park_pool)
    : gpu_(gpu),
      green_pool_(green_pool),
      idle_timeout_(idle_timeout),
      park_pool_(park_pool),
      idle_since_(Clock::now()) {}

tl::expected<void, std::string> ContextLease::acquire() {
  idle_ = false;
  served_ = true;
  if (held()) {
    if (park_pool_ != nullptr) park_pool_->fill(gpu_.primary);  // the context open_gpu retained
    return {};
  }
  const auto started = Clock::now();
  CUcontext primary = nullptr;
  if (CUresult r = gpu_.cu->cuDevicePrimaryCtxRetain(&primary, gpu_.device); r != CUDA_SUCCESS) {
    return tl::unexpected(
        fmt::format("retaining the GPU's primary context failed: {}", describe(*gpu_.cu, r)));
  }
  if (CUresult r = gpu_.cu->cuCtxSetCurrent(primary); r != CUDA_SUCCESS) {
    gpu_.cu->cuDevicePrimaryCtxRelease_v2(gpu_.device);
    return tl::unexpected(
        fmt::format("making the GPU's primary context current failed: {}", describe(*gpu_.cu, r)));
  }
  gpu_.primary = primary;
  ++gpu_.primary_generation;
  if (park_pool_ != nullptr) park_pool_->fill(primary);
  log_info("retained the primary context for a client in {:.0f} ms",
           std::chrono::duration<double, std::milli>(Clock::now() - started).count());
  return {};
}

void ContextLease::check(std::size_t sessions, Clock::time_point now) {
  if (sessions != 0) {
    idle_ = false;
    return;
  }
  if (!idle_) {
    idle_ = true;
    idle_since_ = now;
  }
  if (!held() || idle_timeout_.count() < 0) return;
  if (now - idle_since_ < idle_timeout_) return;
  release(served_ ? "no client for the idle timeout" : "no client since the server's start");
}

void ContextLease::release(const char* why) {
  if (!held()) return;
  // Only with no session anywhere (check) or at the server's end: nobody takes from the pool
  // meanwhile. Its idle green contexts first, so that the release gives back all they cost.
  const std::size_t emptied = green_pool_.empty();
  if (park_pool_ != nullptr) park_pool_->drain();
  gpu_.cu->cuCtxSetCurrent(nullptr);
  if (CUresult r = gpu_.cu->cuDevicePrimaryCtxRelease_v2(gpu_.device); r != CUDA_SUCCESS) {
    log_warn("releasing the primary context failed: {}", describe(*gpu_.cu, r));
  } else {
    log_info(
        "released the primary context ({}) and {} idle green context(s): their GPU memory is "
        "free until the next client",
        why, emptied);
  }
  gpu_.primary = nullptr;
}

}  // namespace mpsshim::server

#include "broker/server/green_context_pool.hpp"

#include <fmt/format.h>

#include <mutex>
#include <utility>
#include <vector>

namespace mpsshim::server {
namespace {

std::mutex pool_mutex;
std::vector<GreenContext> pool;  // idle; under pool_mutex

// Everything make_green_context reads, so that equal shapes give equal SMs.
std::string shape_of(const DriverTable& cu, CUdevice device, const SmQuota& quota,
                     unsigned granularity, const SmPlacement& placement) {
  return fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{}", static_cast<const void*>(&cu), device,
                     quota.whole_device, quota.target, quota.split_flags, granularity,
                     placement.slot, placement.slots, placement.partition, placement.first_group,
                     placement.groups);
}

}  // namespace

tl::expected<GreenContext, CUresult> take_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota, unsigned granularity,
                                                        SmPlacement placement) {
  std::string shape = shape_of(cu, device, quota, granularity, placement);
  {
    std::lock_guard lock(pool_mutex);
    for (auto it = pool.begin(); it != pool.end(); ++it) {
      if (it->shape != shape) continue;
      GreenContext found = std::move(*it);
      pool.erase(it);
      return found;
    }
  }
  auto made = make_green_context(cu, device, device_sms, quota, granularity, placement);
  if (made) made->shape = std::move(shape);
  return made;
}

CUresult give_back_green_context(const DriverTable& cu, GreenContext green) {
  if (green.green == nullptr) return CUDA_SUCCESS;
  if (!green.shape.empty()) {
    std::lock_guard lock(pool_mutex);
    if (pool.size() < kMaxPooledGreenContexts) {
      pool.push_back(std::move(green));
      return CUDA_SUCCESS;
    }
  }
  return cu.cuGreenCtxDestroy(green.green);
}

void empty_green_context_pool(const DriverTable& cu) {
  // Only this driver's: a test process may run servers on several drivers.
  const std::string prefix = fmt::format("{}/", static_cast<const void*>(&cu));
  std::vector<GreenContext> idle;
  {
    std::lock_guard lock(pool_mutex);
    for (auto it = pool.begin(); it != pool.end();) {
      if (it->shape.starts_with(prefix)) {
        idle.push_back(std::move(*it));
        it = pool.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const GreenContext& green : idle) cu.cuGreenCtxDestroy(green.green);
}

std::size_t pooled_green_contexts() {
  std::lock_guard lock(pool_mutex);
  return pool.size();
}

}  // namespace mpsshim::server

#include "broker/server/scheduling/green_context_pool.hpp"

#include <algorithm>
#include <utility>

#include "broker/server/driver/driver.hpp"
#include "common/log.hpp"

namespace mpsshim::server {

GreenContextPool::GreenContextPool(const Gpu& gpu, std::size_t capacity)
    : gpu_(gpu), capacity_(capacity) {}

GreenContextPool::~GreenContextPool() {
  empty();
}

tl::expected<GreenContext, CUresult> GreenContextPool::take(const SmQuota& quota,
                                                            unsigned granularity,
                                                            SmPlacement placement) {
  return take(green_shape(quota, granularity, placement), [&] {
    return make_green_context(*gpu_.cu, gpu_.device, gpu_.sm_resource, quota, granularity,
                              placement);
  });
}

tl::expected<GreenContext, CUresult> GreenContextPool::take(const GreenShape& shape,
                                                            const Maker& make) {
  {
    std::lock_guard lock(mutex_);
    // The newest first: the shape most recently seen is the likeliest to come again.
    auto kept = std::find_if(idle_.rbegin(), idle_.rend(),
                             [&](const GreenContext& g) { return g.shape == shape; });
    if (kept != idle_.rend()) {
      GreenContext found = std::move(*kept);
      idle_.erase(std::next(kept).base());
      ++reused_;
      return found;
    }
  }
  auto made = make();
  if (made) {
    made->shape = shape;
    std::lock_guard lock(mutex_);
    ++created_;
  }
  return made;
}

CUresult GreenContextPool::give_back(GreenContext green) {
  if (green.green == nullptr) return CUDA_SUCCESS;
  if (green.shape.kind == GreenShape::Kind::kNone || capacity_ == 0) return destroy(green);
  // Nothing of the old session may still run in it when the next session gets it. Its streams
  // were idle when the session was freed, so this returns at once; it makes sure of work on
  // streams destroyed earlier (a client context destroyed with work queued).
  const DriverTable& cu = *gpu_.cu;
  CUresult synced = cu.cuCtxSetCurrent(green.context);
  if (synced == CUDA_SUCCESS) synced = cu.cuCtxSynchronize();
  cu.cuCtxSetCurrent(gpu_.primary);  // what everything else in the server runs with
  if (synced != CUDA_SUCCESS) {
    destroy(green);
    return synced;
  }
  GreenContext evicted;
  {
    std::lock_guard lock(mutex_);
    if (idle_.size() >= capacity_) {
      evicted = std::move(idle_.front());
      idle_.erase(idle_.begin());
    }
    idle_.push_back(std::move(green));
  }
  return evicted.green == nullptr ? CUDA_SUCCESS : destroy(evicted);
}

std::size_t GreenContextPool::empty() {
  std::vector<GreenContext> idle;
  {
    std::lock_guard lock(mutex_);
    idle.swap(idle_);
  }
  for (const GreenContext& green : idle) {
    if (CUresult r = destroy(green); r != CUDA_SUCCESS) {
      log_warn("destroying an idle green context failed: {}", describe(*gpu_.cu, r));
    }
  }
  return idle.size();
}

GreenContextPoolFigures GreenContextPool::figures() const {
  std::lock_guard lock(mutex_);
  return {idle_.size(), capacity_, created_, reused_, destroyed_};
}

CUresult GreenContextPool::destroy(const GreenContext& green) {
  {
    std::lock_guard lock(mutex_);
    ++destroyed_;
  }
  return gpu_.cu->cuGreenCtxDestroy(green.green);
}

}  // namespace mpsshim::server

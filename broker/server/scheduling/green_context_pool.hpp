// Green contexts kept for the next session instead of destroyed.
//
// Why: the real driver does not give back what a green context cost when it is destroyed while
// the primary context lives. Measured on an H100 with driver 580.159.04
// (tools/probes/green_context_churn.cpp): each cuGreenCtxCreate + cuGreenCtxDestroy keeps
// ~1.65 MiB of host memory and 4 MiB of device memory until the primary context is released;
// streams created and destroyed on one green context cost nothing. A server gives each session a
// green context, so the GPU soak (docs/testing.md) grew by that much per client. Sessions of the
// same GreenShape get the same SMs, so a finished session's green context serves the next one
// of that shape: with 100 % quotas one green context per concurrent client lasts the server's
// life.
//
// Ownership: the Server owns one pool (a server serves one GPU); sessions borrow it. Admission
// (the coordinator) takes; session ends and live SM quota changes (the session's worker) take
// and give back; the context lease (the coordinator) empties it before it releases the primary
// context, which is the only time the driver gives the memory back. Those are several threads,
// hence the mutex; none of these calls is on the launch path.
//
// A green context is given back only with nothing of its session on it: the session's streams
// are destroyed (retire.cpp, free_everything) and the pool synchronizes it before keeping it, so
// that no work of the old session is pending when the next one gets it.
#pragma once

#include <functional>

#include <cstddef>
#include <mutex>
#include <vector>

#include "broker/server/driver/gpu.hpp"
#include "broker/server/scheduling/green_context.hpp"

namespace mpsshim::server {

// Idle green contexts kept at most (of all shapes) unless ServerSettings::green_context_pool says
// otherwise (the tests; no command-line option sets it). Each costs ~4 MiB of device memory and
// ~1.65 MiB of host memory on an H100 (the same as a destroyed one while the primary context
// lives), so a full pool holds ~128 MiB of device memory until the context is released at rest.
// Past it the oldest idle one is destroyed: with more distinct shapes (or more clients leaving at
// once) than this, the driver's per-context cost comes back until the server is idle.
inline constexpr std::size_t kDefaultGreenContextPoolCapacity = 32;

struct GreenContextPoolFigures {
  std::size_t idle = 0;       // kept now
  std::size_t capacity = 0;   // kept at most
  std::size_t created = 0;    // made because none of the shape was kept
  std::size_t reused = 0;     // handed out again
  std::size_t destroyed = 0;  // evicted past the capacity, emptied, or not kept
};

class GreenContextPool {
 public:
  // `gpu` (the server's) outlives the pool; `capacity` 0 keeps nothing (every give_back
  // destroys, as before the pool).
  GreenContextPool(const Gpu& gpu, std::size_t capacity);
  ~GreenContextPool();  // destroys what it keeps
  GreenContextPool(const GreenContextPool&) = delete;
  GreenContextPool& operator=(const GreenContextPool&) = delete;

  // A kept green context of this shape (make_green_context's arguments), else a new one.
  tl::expected<GreenContext, CUresult> take(const SmQuota& quota, unsigned granularity = 0,
                                            SmPlacement placement = {});
  // A kept green context of `shape`, else what `make` makes (marked with `shape`).
  using Maker = std::function<tl::expected<GreenContext, CUresult>()>;
  tl::expected<GreenContext, CUresult> take(const GreenShape& shape, const Maker& make);
  // Keeps `green` for a later session of its shape, or destroys it (no shape, capacity 0, or it
  // did not synchronize). `green` must have no stream left. Returns the first error of
  // synchronizing or destroying, else CUDA_SUCCESS. With the pool full, the oldest idle one is
  // destroyed to make room.
  CUresult give_back(GreenContext green);
  // Destroys every idle green context (before the primary context is released); how many.
  std::size_t empty();

  GreenContextPoolFigures figures() const;

 private:
  CUresult destroy(const GreenContext& green);  // not under mutex_: it counts under it

  const Gpu& gpu_;
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<GreenContext> idle_;  // oldest first; under mutex_
  std::size_t created_ = 0;         // the counters: under mutex_
  std::size_t reused_ = 0;
  std::size_t destroyed_ = 0;
};

}  // namespace mpsshim::server

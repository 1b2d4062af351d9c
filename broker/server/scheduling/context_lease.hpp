// The GPU's primary context, held only while clients need it. A primary context costs ~500 MiB
// of GPU memory (H100, driver 580) before anyone allocates a byte, so a server with no client
// releases it after `idle_timeout` and retains it again for the next client, which pays the
// context's creation once (544 ms measured on an H100). A negative timeout keeps it for the
// server's life.
//
// The context open_gpu retained at the server's start counts as one a client just left: it is
// kept for `idle_timeout` too. A daemon is often started just before its first client (a job
// script, a container's entry point), which would otherwise wait for the context the server had
// in hand seconds earlier: on an H200 the first PyTorch client after a start took 1.47-1.60 s
// from `import torch` to its first result with the context released at start, 0.55-1.04 s with
// it kept, natively 0.83-1.29 s (docs/benchmarks.md, "Start to first result"). Such a client's
// import alone takes 7-12 s there, and a 10 s timeout missed 3 of 12 such clients.
//
// Owned by the coordinator thread. Workers read Gpu::primary only while they own a session:
// a retain happens before the new session is handed over (the worker's mailbox orders it), a
// release only once every worker's load is 0 (Worker::load_ orders it after their last use).
#pragma once

#include <chrono>
#include <string>

#include <tl/expected.hpp>

#include "broker/server/driver/gpu.hpp"
#include "broker/server/driver/park_pool.hpp"
#include "broker/server/scheduling/green_context_pool.hpp"

namespace mpsshim::server {

class ContextLease {
 public:
  using Clock = std::chrono::steady_clock;

  // `gpu` holds the context open_gpu retained; the lease may release it at the first check.
  // `green_pool` is emptied before every release: the driver gives back what a green context
  // cost only with the primary context (green_context_pool.hpp).
  // `park_pool` (null: none) is filled after every retain and drained before every release: its
  // registration lives in the context (park_pool.hpp).
  ContextLease(Gpu& gpu, GreenContextPool& green_pool, std::chrono::milliseconds idle_timeout,
               ParkPool* park_pool = nullptr);

  // Before a client is admitted: the context, retained and made current on this thread.
  tl::expected<void, std::string> acquire();
  // Every look of the coordinator: with `sessions` == 0 for idle_timeout, releases.
  void check(std::size_t sessions, Clock::time_point now = Clock::now());
  // Orderly end of the server.
  void release(const char* why);
  bool held() const { return gpu_.primary != nullptr; }

 private:
  Gpu& gpu_;
  GreenContextPool& green_pool_;
  std::chrono::milliseconds idle_timeout_;
  ParkPool* park_pool_;
  // When the last session went away, or the server started if none was ever served.
  Clock::time_point idle_since_;
  bool idle_ = true;
  bool served_ = false;  // whether any client was ever admitted (for the release's log line)
};

}  // namespace mpsshim::server

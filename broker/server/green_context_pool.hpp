// Green contexts kept for the next session instead of destroyed.
//
// Why: the real driver does not give back what a green context cost when it is destroyed while
// the primary context lives. Measured on an H100 with driver 580.159.04
// (tools/probes/green_context_churn.cpp): each cuGreenCtxCreate + cuGreenCtxDestroy keeps
// ~1.65 MiB of host memory and 4 MiB of device memory until the primary context is released;
// streams created and destroyed on one green context cost nothing. A server gives each session a
// green context, so the GPU soak (docs/testing.md) grew by that much per client. Sessions of the
// same quota and placement need the same SMs, so a finished session's green context serves the
// next one of that shape: with 100 % quotas one green context lasts the server's life.
//
// Ownership: one pool per server process (a server serves one GPU). Admission (the coordinator)
// takes; session ends and live quota changes (the session's worker) give back; the context lease
// (the coordinator) empties it before it releases the primary context. Hence a mutex; none of
// these is on the launch path. A returned context has no stream of the session left (the
// session's end destroyed them) and its work is done (the session drained).
#pragma once

#include <cstddef>

#include "broker/server/green_context.hpp"

namespace mpsshim::server {

// At most this many idle green contexts are kept (of all shapes); past it they are destroyed.
inline constexpr std::size_t kMaxPooledGreenContexts = 32;

// An idle green context of this shape, else a new one (make_green_context's arguments).
tl::expected<GreenContext, CUresult> take_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota,
                                                        unsigned granularity = 0,
                                                        SmPlacement placement = {});

// Keeps `green` for a later session of its shape (or destroys it when the pool is full or it
// has no shape). Returns the result of cuGreenCtxDestroy, or CUDA_SUCCESS when kept.
CUresult give_back_green_context(const DriverTable& cu, GreenContext green);

// Destroys every idle green context: before the primary context is released.
void empty_green_context_pool(const DriverTable& cu);

// Idle green contexts now (for tests and the log).
std::size_t pooled_green_contexts();

}  // namespace mpsshim::server

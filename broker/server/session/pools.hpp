// The client's memory pools on the server (ops/memory_pool.cpp).
#pragma once

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// cudaMallocAsync memory: owned by a pool id, not a context.
bool is_pool_allocation(Session& session, const DeviceRange& range);

// A pool's allocation in the arena is being freed (cuMemFreeAsync, cuMemFree): its pool, if it
// still exists, stops counting it.
void pool_memory_freed(Session& session, const DeviceRange& range);

// Session end, after the pools' allocations were freed: destroys every pool of the client.
void destroy_pools(Session& session);

}  // namespace mpsshim::server

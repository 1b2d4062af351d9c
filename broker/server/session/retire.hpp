// Letting go of a client's objects. Handles stop working at once; what the GPU may still be
// using (memory, modules, libraries, pinned regions) is freed once fences recorded on every
// stream of the client have completed, so no free blocks the server on queued work.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// Queues the bundle behind fences on every stream of the client.
CUresult retire(Session& session, Retired bundle);

// Frees cuMemAlloc'd memory now: the arena's (device_heap.hpp) or the driver's.
void free_device(Session& session, CUdeviceptr base);

// Frees what a bundle holds, now. Counts into tally when given.
void free_retired(Session& session, Retired& bundle, FreedTally* tally = nullptr);

// Forgets a module's functions and globals; an owned module goes into the bundle.
void forget_module(Session& session, std::uint64_t module_id, Retired& bundle);
// Forgets a library's kernels (and their functions), modules and globals; the library goes
// into the bundle.
void forget_library(Session& session, std::uint64_t library_id, Retired& bundle);

// Destroys a stream now (the driver lets queued work finish): a blocking stream's unjoined
// work is first handed to its context's default stream, as the legacy stream would wait for it.
void destroy_stream(Session& session, std::uint64_t stream_id);

// cuCtxDestroy for a client context: everything made in it.
CUresult retire_context(Session& session, std::uint64_t ctx_id);

// Destroys every graph of the client that it owns (graphs are never in use by GPU work; their
// executable graphs are) and forgets their nodes; returns how many were destroyed (graph.cpp).
std::size_t forget_graphs(Session& session);
// Forgets one graph's nodes, and the graph (destroying it when owned).
void forget_graph(Session& session, std::uint64_t graph_id);

// Session end, once the client's streams are idle: frees everything it owned, the green
// context and the staging registration included.
FreedTally free_everything(Session& session);

}  // namespace mpsshim::server

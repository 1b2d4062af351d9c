// Host functions the server runs again and again: a graph's host nodes (graph_nodes.cpp).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mpsshim::shim {

class Session;

// The id under which the server has this process run fn(user_data) at every replay of a host
// node; 0 when the server has no callback cells (logged; the caller answers
// CUDA_ERROR_NOT_SUPPORTED). Kept for the process's life: any executable graph made from the
// node may run it.
std::uint64_t keep_host_callback(Session* session, CUhostFn fn, void* user_data) noexcept;

}  // namespace mpsshim::shim

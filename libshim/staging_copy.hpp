// Copies between the application's pageable memory and a staging chunk. A large pageable copy
// moves every byte through the CPU once (the DMA engine only reaches the chunks), so how the
// CPU writes decides its speed: ordinary stores to a destination that is not in cache read
// each line first (read-for-ownership), doubling the memory traffic; streaming stores skip the
// read. For a staging chunk (H2D) the CPU never reads the bytes again; for the application's
// buffer (D2H) a copy of megabytes leaves the cache anyway.
//
// MPSSHIM_STAGING_STORES=streaming|cached picks the stores of pieces of kStreamingMinBytes and
// more (default: streaming on x86-64, cached elsewhere); docs/environment.md. Pieces of
// kParallelMinBytes and more are shared among the copy helper threads (libshim/copy_pool.hpp).
#pragma once

#include <cstddef>

namespace mpsshim::shim {

inline constexpr std::size_t kStreamingMinBytes = std::size_t{256} << 10;

void staging_copy(void* dst, const void* src, std::size_t bytes);

}  // namespace mpsshim::shim

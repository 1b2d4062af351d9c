// Helper threads that share the CPU's part of a large pageable copy. Every byte of a pageable
// copy passes through a CPU core once (into or out of a staging chunk the DMA engine reaches),
// and one core of a server CPU copies far slower than PCIe moves: on the H100 host, one thread
// reached 7-13 GB/s, three or four 18-34 GB/s (tools/probes/parallel_staging.cpp,
// docs/benchmarks.md). The driver's own pageable copies use one thread, so this is where the shim
// can beat them.
//
// Threads: the pool's helpers are started by the first large copy of the process, with every
// signal blocked, named "mpsshim-copy". A helper spins a while after each copy (a large copy
// comes as a train of 2 MiB pieces, microseconds apart), then sleeps on a futex.
//
// Ownership: one copy at a time uses the helpers. The caller that takes the pool publishes the
// job, copies parts itself, waits for the parts the helpers claimed, and closes the job; a copy
// that finds the pool taken (another application thread is copying), a copy in a forked child
// (its helpers did not survive the fork) and a copy below kParallelMinBytes run on the calling
// thread alone. Parts are claimed one at a time from a shared counter, so a helper that wakes
// late leaves its parts to the others and never delays the copy.
//
// MPSSHIM_COPY_THREADS=N: threads per copy, the caller included (1 = no helpers). Default: a
// quarter of the CPUs this process may keep busy (cpu_budget.hpp: its affinity, and its cgroup's
// CPU quota), at most 4.
#pragma once

#include <cstddef>

namespace mpsshim::shim {

// Below this a copy is not split: waking helpers would cost more than they save.
inline constexpr std::size_t kParallelMinBytes = std::size_t{1} << 20;
// What a thread claims at a time.
inline constexpr std::size_t kCopyPartBytes = std::size_t{256} << 10;

using CopyFunction = void (*)(std::byte* dst, const std::byte* src, std::size_t bytes);

// Threads a large copy uses (MPSSHIM_COPY_THREADS, or the default), read once.
int copy_threads();

// Copies `bytes` with `copy` (each part of at least kCopyPartBytes goes to one call, in some
// thread), on up to copy_threads() threads. Returns when every byte is written and visible to
// the calling thread; `copy` must fence its own weakly ordered stores.
void parallel_copy(std::byte* dst, const std::byte* src, std::size_t bytes, CopyFunction copy);

}  // namespace mpsshim::shim

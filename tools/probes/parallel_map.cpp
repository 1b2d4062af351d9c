// Black-box probe of the real driver: how long mapping thousands of physical allocations takes,
// and whether cuMemMap calls from several threads run in parallel. Memory preemption hands a
// preempted PyTorch client's expandable segments (thousands of 20 MiB cuMemCreate allocations)
// to the allocation it makes room for, mapped one after another (device_heap.hpp); on an H200,
// 3,073 of them took 130 ms one thread.
// For COUNT allocations of 20 MiB: cuMemMap of each at consecutive addresses from 1, 2, 4, 8 and
// 16 threads (each with the primary context current), one cuMemSetAccess over the whole, then
// cuMemUnmap of each; the times of the map and of the access. Then map and access per mapping,
// each thread for its own. And one map from a thread with no context current: whether cuMemMap
// needs one.
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/parallel_map.cpp
//     -lcuda -lpthread -o /tmp/parallel_map && /tmp/parallel_map [COUNT]
#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Runs step(i) for i in [0, count), split into `threads` consecutive runs, each thread with
// `context` current; the milliseconds it took. A step that fails ends the probe.
template <typename Step>
double on_threads(unsigned threads, std::size_t count, CUcontext context, Step step) {
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  std::vector<CUresult> results(threads, CUDA_SUCCESS);
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      cuCtxSetCurrent(context);
      for (std::size_t i = t * count / threads; i < (t + 1) * count / threads; ++i) {
        if (CUresult r = step(i); r != CUDA_SUCCESS) {
          results[t] = r;
          return;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  const double ms = ms_since(start);
  for (CUresult r : results) MUST(r);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 3072;
  CUcontext context = nullptr;
  const CUdevice device = start_on_gpu0(&context);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const std::size_t piece = std::size_t{20} << 20;
  std::vector<CUmemGenericAllocationHandle> handles(count);
  for (auto& h : handles) MUST(cuMemCreate(&h, piece, &prop, 0));
  CUdeviceptr base = 0;
  MUST(cuMemAddressReserve(&base, piece * count, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  {
    // cuMemMap from a thread with no current context.
    CUresult r = CUDA_SUCCESS;
    std::thread bare([&] { r = cuMemMap(base, piece, 0, handles[0], 0); });
    bare.join();
    std::printf("cuMemMap with no context current: %s\n", name(r));
    if (r == CUDA_SUCCESS) MUST(cuMemUnmap(base, piece));
  }
  auto map = [&](std::size_t i) { return cuMemMap(base + i * piece, piece, 0, handles[i], 0); };
  for (unsigned threads : {1u, 2u, 4u, 8u, 16u}) {
    const double map_ms = on_threads(threads, count, context, map);
    const auto access_start = Clock::now();
    MUST(cuMemSetAccess(base, piece * count, &access, 1));
    const double access_ms = ms_since(access_start);
    const auto unmap_start = Clock::now();
    for (std::size_t i = 0; i < count; ++i) MUST(cuMemUnmap(base + i * piece, piece));
    std::printf(
        "%zu x 20 MiB, %2u threads: map %.1f ms (%.1f us each), set access %.1f ms, unmap %.1f "
        "ms\n",
        count, threads, map_ms, map_ms * 1000 / static_cast<double>(count), access_ms,
        ms_since(unmap_start));
  }
  // Access set per mapping instead, each thread for the mappings it made.
  for (unsigned threads : {1u, 4u, 8u, 16u}) {
    const double map_ms = on_threads(threads, count, context, [&](std::size_t i) {
      CUresult r = map(i);
      return r == CUDA_SUCCESS ? cuMemSetAccess(base + i * piece, piece, &access, 1) : r;
    });
    for (std::size_t i = 0; i < count; ++i) MUST(cuMemUnmap(base + i * piece, piece));
    std::printf("%zu x 20 MiB, %2u threads: map and set access per mapping %.1f ms\n", count,
                threads, map_ms);
  }
  MUST(cuMemAddressFree(base, piece * count));
  for (auto h : handles) MUST(cuMemRelease(h));
  return 0;
}

// Launch and synchronization costs through the Driver API, the figures a shim must not inflate:
//   launch_async_cpu      client CPU time per asynchronous empty-kernel launch (the launch loop
//                         only; median over repeats of the mean per launch)
//   launch_stream_sync    launch + cuStreamSynchronize round trip (median, p99 of single trips)
//   launch_ctx_sync       launch + cuCtxSynchronize round trip (cudaDeviceSynchronize's path)
//   ctx_sync_idle         cuCtxSynchronize with nothing queued
//   mem_alloc_free        one cuMemAlloc + cuMemFree pair of --alloc-bytes
//   mem_alloc_async_free  one cuMemAllocAsync + cuMemFreeAsync pair of --alloc-bytes on a stream
//                         (the device's default pool, as cudaMallocAsync), the stream synchronized
//                         after each pair, as a framework's step does
//   ctx_get_device        cuCtxGetDevice, which frameworks call tens of thousands of times
#include <cuda.h>

#include <cstdio>
#include <vector>

#include "bench/bench_output.hpp"
#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;
namespace bench = mpsshim::bench;

namespace {

constexpr const char* kName = "launch_latency";

struct Trips {
  double median_us;
  double p99_us;
};

// Times `count` single round trips of `trip` and summarises them.
template <class Trip>
Trips time_trips(long long count, Trip trip) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(count));
  for (long long i = 0; i < count; ++i) {
    const auto start = ex::Clock::now();
    trip();
    us.push_back(1e6 * ex::seconds_since(start));
  }
  return {bench::median(us), bench::quantile(us, 0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report(kName);
  ex::Cli cli(argc, argv,
              "[--quick] [--launches N (100000; quick 20000)] [--repeats R (5; quick 3)] "
              "[--trips N (10000; quick 2000)] [--allocs N (10000; quick 2000)] "
              "[--alloc-bytes B (1M)] [--device ORDINAL]");
  const bool quick = cli.flag("--quick");
  const auto launches = cli.integer("--launches", quick ? 20000 : 100000, 1, 100000000);
  const auto repeats = cli.integer("--repeats", quick ? 3 : 5, 1, 1000);
  const auto trips = cli.integer("--trips", quick ? 2000 : 10000, 1, 100000000);
  const auto allocs = cli.integer("--allocs", quick ? 2000 : 10000, 1, 100000000);
  const auto alloc_bytes = cli.integer("--alloc-bytes", 1 << 20, 1, 1LL << 34);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction empty = ex::get_function(module, "empty_kernel");
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 100; ++i) CU_CHECK(ex::launch_kernel(empty, {1}, {1}, stream));
  CU_CHECK(cuStreamSynchronize(stream));

  bench::csv_header();

  std::vector<double> per_launch_us;
  for (long long r = 0; r < repeats; ++r) {
    const auto start = ex::Clock::now();
    for (long long i = 0; i < launches; ++i) CU_CHECK(ex::launch_kernel(empty, {1}, {1}, stream));
    per_launch_us.push_back(1e6 * ex::seconds_since(start) / static_cast<double>(launches));
    CU_CHECK(cuStreamSynchronize(stream));  // not timed: the queue drains between repeats
  }
  const double launch_cpu_us = bench::median(per_launch_us);
  bench::csv(kName, "launch_async_cpu", 0, launch_cpu_us, "us");

  const Trips stream_sync = time_trips(trips, [&] {
    CU_CHECK(ex::launch_kernel(empty, {1}, {1}, stream));
    CU_CHECK(cuStreamSynchronize(stream));
  });
  bench::csv(kName, "launch_stream_sync", 0, stream_sync.median_us, "us");
  bench::csv(kName, "launch_stream_sync_p99", 0, stream_sync.p99_us, "us");

  const Trips ctx_sync = time_trips(trips, [&] {
    CU_CHECK(ex::launch_kernel(empty, {1}, {1}, stream));
    CU_CHECK(cuCtxSynchronize());
  });
  bench::csv(kName, "launch_ctx_sync", 0, ctx_sync.median_us, "us");
  bench::csv(kName, "launch_ctx_sync_p99", 0, ctx_sync.p99_us, "us");

  const Trips idle_sync = time_trips(trips, [&] { CU_CHECK(cuCtxSynchronize()); });
  bench::csv(kName, "ctx_sync_idle", 0, idle_sync.median_us, "us");

  const Trips alloc_free = time_trips(allocs, [&] {
    CUdeviceptr p = 0;
    CU_CHECK(cuMemAlloc(&p, static_cast<std::size_t>(alloc_bytes)));
    CU_CHECK(cuMemFree(p));
  });
  bench::csv(kName, "mem_alloc_free", static_cast<std::size_t>(alloc_bytes), alloc_free.median_us,
             "us");

  const Trips alloc_async = time_trips(allocs, [&] {
    CUdeviceptr p = 0;
    CU_CHECK(cuMemAllocAsync(&p, static_cast<std::size_t>(alloc_bytes), stream));
    CU_CHECK(cuMemFreeAsync(p, stream));
    CU_CHECK(cuStreamSynchronize(stream));
  });
  bench::csv(kName, "mem_alloc_async_free", static_cast<std::size_t>(alloc_bytes),
             alloc_async.median_us, "us");

  constexpr long long kGetDeviceCalls = 1000000;
  CUdevice current = -1;
  const auto get_device_start = ex::Clock::now();
  for (long long i = 0; i < kGetDeviceCalls; ++i) CU_CHECK(cuCtxGetDevice(&current));
  const double get_device_ns =
      1e9 * ex::seconds_since(get_device_start) / static_cast<double>(kGetDeviceCalls);
  bench::csv(kName, "ctx_get_device", 0, get_device_ns, "ns");
  report.expect(current == device.device, "ctx_get_device");

  std::printf("# launch_latency (%lld launches x %lld repeats, %lld round trips)\n", launches,
              repeats, trips);
  std::printf("#   empty-kernel async launch, client CPU  %9.3f us\n", launch_cpu_us);
  std::printf("#   launch + cuStreamSynchronize           %9.3f us (p99 %.3f)\n",
              stream_sync.median_us, stream_sync.p99_us);
  std::printf("#   launch + cuCtxSynchronize              %9.3f us (p99 %.3f)\n",
              ctx_sync.median_us, ctx_sync.p99_us);
  std::printf("#   cuCtxSynchronize, idle                 %9.3f us\n", idle_sync.median_us);
  std::printf("#   cuMemAlloc + cuMemFree (%lld B)        %9.3f us\n", alloc_bytes,
              alloc_free.median_us);
  std::printf("#   cuMemAllocAsync + cuMemFreeAsync + sync %8.3f us\n", alloc_async.median_us);
  std::printf("#   cuCtxGetDevice                         %9.1f ns\n", get_device_ns);

  report.add_fixed("launch_cpu_us", launch_cpu_us, 3);
  report.add_fixed("launch_stream_sync_us", stream_sync.median_us, 3);
  report.add_fixed("launch_ctx_sync_us", ctx_sync.median_us, 3);
  report.add_fixed("ctx_sync_idle_us", idle_sync.median_us, 3);
  report.add_fixed("alloc_free_us", alloc_free.median_us, 3);
  report.add_fixed("alloc_async_free_us", alloc_async.median_us, 3);
  report.add_fixed("ctx_get_device_ns", get_device_ns, 1);

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}

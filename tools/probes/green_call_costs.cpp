// Black-box probe of the real driver: what do the calls the server makes per client record cost
// on a green context's stream, with the primary context current (as the server's workers run),
// against the same calls on a primary-context stream and with the green context current?
// The shim's idle cuCtxSynchronize (one cuStreamQuery per stream on the server) measured 5-7 us
// on an H100 against 0.4-0.8 us natively; this finds out whether the driver calls are the cost.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o /tmp/probe_kernel.cubin tools/probes/probe_kernel.cu
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/green_call_costs.cpp -lcuda \
//     -o /tmp/green_costs
//   /tmp/green_costs /tmp/probe_kernel.cubin
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Median over 15 batches of the mean cost of `calls` calls of `f`, in microseconds.
double cost_us(int calls, const std::function<void()>& f) {
  std::vector<double> batches;
  for (int b = 0; b < 15; ++b) {
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) f();
    batches.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / calls);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

struct Target {
  const char* name;
  CUstream stream;
  CUevent event;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s probe_kernel.cubin\n", argv[0]);
    return 2;
  }
  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext primary;
  MUST(cuDevicePrimaryCtxRetain(&primary, dev));
  MUST(cuCtxSetCurrent(primary));
  CUmodule module;
  MUST(cuModuleLoad(&module, argv[1]));
  CUfunction empty;
  MUST(cuModuleGetFunction(&empty, module, "empty"));

  // A green context over every SM, and one over a group of 16 SMs, as the server makes them.
  CUdevResource sms{};
  MUST(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResourceDesc whole_desc;
  MUST(cuDevResourceGenerateDesc(&whole_desc, &sms, 1));
  CUgreenCtx whole;
  MUST(cuGreenCtxCreate(&whole, whole_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource group{}, rest{};
  unsigned groups = 1;
  MUST(cuDevSmResourceSplitByCount(&group, &groups, &sms, &rest, 0, 16));
  CUdevResourceDesc part_desc;
  MUST(cuDevResourceGenerateDesc(&part_desc, &group, 1));
  CUgreenCtx part;
  MUST(cuGreenCtxCreate(&part, part_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext whole_ctx, part_ctx;
  MUST(cuCtxFromGreenCtx(&whole_ctx, whole));
  MUST(cuCtxFromGreenCtx(&part_ctx, part));

  std::vector<Target> targets(3);
  targets[0].name = "primary stream";
  MUST(cuStreamCreate(&targets[0].stream, CU_STREAM_NON_BLOCKING));
  targets[1].name = "green (all SMs) stream";
  MUST(cuGreenCtxStreamCreate(&targets[1].stream, whole, CU_STREAM_NON_BLOCKING, 0));
  targets[2].name = "green (16 SMs) stream";
  MUST(cuGreenCtxStreamCreate(&targets[2].stream, part, CU_STREAM_NON_BLOCKING, 0));
  for (Target& t : targets) MUST(cuEventCreate(&t.event, CU_EVENT_DISABLE_TIMING));

  auto launch = [&](CUstream s) {
    MUST(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr));
  };
  auto run_all = [&](const char* current) {
    std::printf("--- current context: %s\n", current);
    for (Target& t : targets) {
      for (int i = 0; i < 200; ++i) launch(t.stream);
      MUST(cuStreamSynchronize(t.stream));
      double query = cost_us(2000, [&] { MUST(cuStreamQuery(t.stream)); });
      double record = cost_us(2000, [&] { MUST(cuEventRecord(t.event, t.stream)); });
      MUST(cuStreamSynchronize(t.stream));
      double equery = cost_us(2000, [&] { MUST(cuEventQuery(t.event)); });
      double async = cost_us(2000, [&] { launch(t.stream); });
      MUST(cuStreamSynchronize(t.stream));
      double sync_rt = cost_us(500, [&] {
        launch(t.stream);
        MUST(cuStreamSynchronize(t.stream));
      });
      double poll_rt = cost_us(500, [&] {
        launch(t.stream);
        MUST(cuEventRecord(t.event, t.stream));
        while (cuEventQuery(t.event) == CUDA_ERROR_NOT_READY) {
        }
      });
      double query_rt = cost_us(500, [&] {
        launch(t.stream);
        while (cuStreamQuery(t.stream) == CUDA_ERROR_NOT_READY) {
        }
      });
      std::printf(
          "%-24s idle cuStreamQuery %.3f  cuEventRecord %.3f  cuEventQuery(done) %.3f  "
          "async launch %.3f  launch+sync %.2f  launch+record+poll %.2f  launch+streamquery "
          "poll %.2f us\n",
          t.name, query, record, equery, async, sync_rt, poll_rt, query_rt);
    }
  };
  // Host fences (broker/server/driver/host_fences.hpp): what a cuStreamWriteValue32 into registered
  // host memory costs the CPU and the GPU, with and without its default memory barrier, against
  // an event record, alone and behind 64 small launches.
  {
    void* page = nullptr;
    MUST(cuMemHostAlloc(&page, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CUdeviceptr word_dev = 0;
    MUST(cuMemHostGetDevicePointer(&word_dev, page, 0));
    auto* word = static_cast<volatile std::uint32_t*>(page);
    std::uint32_t ticket = 0;
    Target& g = targets[1];
    for (unsigned flags : {0u, unsigned{CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER}}) {
      double write_cpu =
          cost_us(2000, [&] { MUST(cuStreamWriteValue32(g.stream, word_dev, ++ticket, flags)); });
      MUST(cuStreamSynchronize(g.stream));
      double write_rt = cost_us(500, [&] {
        launch(g.stream);
        MUST(cuStreamWriteValue32(g.stream, word_dev, ++ticket, flags));
        while (*word != ticket) {
        }
      });
      double burst_write = cost_us(50, [&] {
        for (int i = 0; i < 64; ++i) launch(g.stream);
        MUST(cuStreamWriteValue32(g.stream, word_dev, ++ticket, flags));
        while (*word != ticket) {
        }
      });
      std::printf(
          "write value (flags %u): CPU %.3f us  launch+write+spin %.2f us  64 launches+write+spin "
          "%.1f us\n",
          flags, write_cpu, write_rt, burst_write);
    }
    double burst_event = cost_us(50, [&] {
      for (int i = 0; i < 64; ++i) launch(g.stream);
      MUST(cuEventRecord(g.event, g.stream));
      while (cuEventQuery(g.event) == CUDA_ERROR_NOT_READY) {
      }
    });
    double burst_both = cost_us(50, [&] {
      for (int i = 0; i < 64; ++i) launch(g.stream);
      MUST(cuStreamWriteValue32(g.stream, word_dev, ++ticket, 0));
      MUST(cuEventRecord(g.event, g.stream));
      while (*word != ticket) {
      }
    });
    std::printf("64 launches+record+poll %.1f us   64 launches+write+record+spin %.1f us\n",
                burst_event, burst_both);
  }
  run_all("primary");
  MUST(cuCtxSetCurrent(whole_ctx));
  run_all("green (all SMs)");
  MUST(cuCtxSetCurrent(primary));
  run_all("primary again");
  return 0;
}

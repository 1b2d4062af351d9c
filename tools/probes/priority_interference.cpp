// Black-box probe of the real driver: where does a latency client's extra time come from when
// batch work runs beside it in another green context of the same process (as in the server)?
// The harness's priority workload (bench/harness/workloads/priority.py) shows mpsshim's
// high-priority client at p50 ~26 us beside four batch clients against ~20.5 us alone, on SMs
// reserved for it. This separates the GPU's share of that from the submissions':
//
//   alone        the latency thread alone: launch a 10 us spin kernel on 2 blocks, synchronize
//   gpu-load     the batch green context already has 2 ms kernels queued (528 blocks x 256
//                threads, like the harness's low-priority clients); no CPU submits while the
//                latency thread measures
//   gpu-load+pri the same, the latency stream at the device's greatest stream priority
//   active       a batch thread loops (8 launches, synchronize) while the latency thread measures
//   active+pri   the same with the latency stream at the greatest priority
//
// The latency green context has `reserve` SMs (24 as mpsshimd's 18% default on an H100), the batch
// one the rest. Launches are made with the primary context current, as the server's workers do.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -Iexamples/kernels -o /tmp/timing.cubin examples/kernels/timing.cu
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/priority_interference.cpp -lcuda \
//     -lpthread -o /tmp/prio_probe
//   /tmp/prio_probe /tmp/timing.cubin [reserve_sms]
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Setup {
  CUcontext primary{};
  CUfunction spin{};
  CUgreenCtx latency{}, batch{};
};

void launch_spin(const Setup& s, CUstream stream, long long ns, unsigned blocks, unsigned threads) {
  void* args[] = {&ns};
  MUST(cuLaunchKernel(s.spin, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr));
}

// `iterations` launch+synchronize round trips of a 10 us kernel on 2 x 32: p50 and p99 in us.
void measure(const char* name, const Setup& s, CUstream stream, int iterations) {
  std::vector<double> us;
  us.reserve(iterations);
  for (int i = 0; i < iterations + 50; ++i) {
    auto t0 = Clock::now();
    launch_spin(s, stream, 10'000, 2, 32);
    MUST(cuStreamSynchronize(stream));
    if (i >= 50) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("%-14s p50 %7.1f us  p90 %7.1f us  p99 %7.1f us  max %8.1f us\n", name,
              us[us.size() / 2], us[us.size() * 9 / 10], us[us.size() * 99 / 100], us.back());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s TIMING_CUBIN [reserve_sms]\n", argv[0]);
    return 2;
  }
  const unsigned reserve = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 24;
  MUST(cuInit(0));
  CUdevice dev{};
  MUST(cuDeviceGet(&dev, 0));
  Setup s;
  MUST(cuDevicePrimaryCtxRetain(&s.primary, dev));
  MUST(cuCtxSetCurrent(s.primary));
  CUmodule module{};
  MUST(cuModuleLoad(&module, argv[1]));
  MUST(cuModuleGetFunction(&s.spin, module, "spin_kernel"));

  CUdevResource sms{}, group{}, rest{};
  MUST(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
  unsigned groups = 1;
  MUST(cuDevSmResourceSplitByCount(&group, &groups, &sms, &rest, 0, reserve));
  CUdevResourceDesc latency_desc{}, batch_desc{};
  MUST(cuDevResourceGenerateDesc(&latency_desc, &group, 1));
  MUST(cuDevResourceGenerateDesc(&batch_desc, &rest, 1));
  MUST(cuGreenCtxCreate(&s.latency, latency_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  MUST(cuGreenCtxCreate(&s.batch, batch_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  std::printf("SMs: %u for the latency client, %u for the batch work, of %u\n", group.sm.smCount,
              rest.sm.smCount, sms.sm.smCount);
  MUST(cuCtxSetCurrent(s.primary));

  int least = 0, greatest = 0;
  MUST(cuCtxGetStreamPriorityRange(&least, &greatest));
  CUstream plain{}, urgent{}, batch{};
  MUST(cuGreenCtxStreamCreate(&plain, s.latency, CU_STREAM_NON_BLOCKING, 0));
  MUST(cuGreenCtxStreamCreate(&urgent, s.latency, CU_STREAM_NON_BLOCKING, greatest));
  MUST(cuGreenCtxStreamCreate(&batch, s.batch, CU_STREAM_NON_BLOCKING, least));
  constexpr int kIterations = 4000;
  constexpr long long kBatchNs = 2'000'000;

  measure("alone", s, plain, kIterations);

  // Enough 2 ms kernels queued to outlast a measurement (~4000 x 30 us = 120 ms).
  for (const auto& [name, stream] :
       {std::pair{"gpu-load", plain}, std::pair{"gpu-load+pri", urgent}}) {
    for (int i = 0; i < 150; ++i) launch_spin(s, batch, kBatchNs, 528, 256);
    measure(name, s, stream, kIterations);
    MUST(cuStreamSynchronize(batch));
  }

  for (const auto& [name, stream] : {std::pair{"active", plain}, std::pair{"active+pri", urgent}}) {
    std::atomic<bool> stop{false};
    std::thread batcher([&] {
      MUST(cuCtxSetCurrent(s.primary));
      while (!stop.load()) {
        for (int i = 0; i < 8; ++i) launch_spin(s, batch, kBatchNs, 528, 256);
        MUST(cuStreamSynchronize(batch));
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    measure(name, s, stream, kIterations);
    stop = true;
    batcher.join();
  }
  measure("alone again", s, plain, kIterations);
  return 0;
}

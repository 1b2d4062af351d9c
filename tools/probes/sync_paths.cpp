// Black-box probe of the real driver: how soon can a waiter learn that a launch finished? The
// shim's cuStreamSynchronize is answered by a server thread that records an event after the
// client's work and polls it; natively the waiting thread spins in cuStreamSynchronize. This
// times launch + wait of an empty kernel, same thread and across threads (a "client" thread
// posting to a "server" thread, as the shim does), with four ways to learn of completion:
// cuStreamSynchronize, cuEventRecord + cuEventQuery polling, cuStreamQuery + record + poll
// (what op_stream_synchronize does), and cuStreamWriteValue32 of a ticket into registered host
// memory that the waiter spins on.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o /tmp/probe_kernel.cubin tools/probes/probe_kernel.cu
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/sync_paths.cpp -lcuda -o /tmp/sync
//   /tmp/sync /tmp/probe_kernel.cubin
#include <cuda.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kIters = 20000;

struct Gpu {
  CUfunction empty;
  CUstream stream;
  CUevent event;
  volatile std::uint32_t* word;  // registered host memory the GPU writes
  CUdeviceptr word_dev;
};

enum class Way { kStreamSync, kEventPoll, kQueryRecordPoll, kWriteValue };
const char* way_name(Way w) {
  switch (w) {
    case Way::kStreamSync:
      return "cuStreamSynchronize";
    case Way::kEventPoll:
      return "record + cuEventQuery poll";
    case Way::kQueryRecordPoll:
      return "cuStreamQuery + record + poll";
    case Way::kWriteValue:
      return "cuStreamWriteValue32 + host spin";
  }
  return "?";
}

void launch(const Gpu& g) {
  MUST(cuLaunchKernel(g.empty, 1, 1, 1, 32, 1, 1, 0, g.stream, nullptr, nullptr));
}

// Issues the wait of iteration `ticket` and, when `wait_here`, waits for it.
void issue_wait(const Gpu& g, Way way, std::uint32_t ticket) {
  switch (way) {
    case Way::kStreamSync:
      MUST(cuStreamSynchronize(g.stream));
      break;
    case Way::kQueryRecordPoll:
      (void)cuStreamQuery(g.stream);
      [[fallthrough]];
    case Way::kEventPoll:
      MUST(cuEventRecord(g.event, g.stream));
      while (cuEventQuery(g.event) == CUDA_ERROR_NOT_READY) {
      }
      break;
    case Way::kWriteValue:
      MUST(cuStreamWriteValue32(g.stream, g.word_dev, ticket, CU_STREAM_WRITE_VALUE_DEFAULT));
      while (*g.word != ticket) {
      }
      break;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void same_thread(const Gpu& g, Way way) {
  std::vector<double> us;
  for (int i = 0; i < kIters; ++i) {
    auto t0 = Clock::now();
    launch(g);
    issue_wait(g, way, static_cast<std::uint32_t>(i + 1) + 0x100000u * static_cast<int>(way));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::printf("same thread   %-34s median %.2f us\n", way_name(way), median(us));
}

// A client thread asks, a server thread launches and learns of completion, the client spins
// on an answer word (or, for kWriteValue, on the word the GPU writes).
void cross_thread(Gpu& g, Way way) {
  CUcontext ctx;
  MUST(cuCtxGetCurrent(&ctx));
  std::atomic<std::uint32_t> request{0}, answer{0};
  std::atomic<bool> stop{false};
  std::thread server([&] {
    MUST(cuCtxSetCurrent(ctx));
    std::uint32_t seen = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      std::uint32_t r = request.load(std::memory_order_acquire);
      if (r == seen) continue;
      seen = r;
      launch(g);
      if (way == Way::kWriteValue) {
        MUST(cuStreamWriteValue32(g.stream, g.word_dev, r, CU_STREAM_WRITE_VALUE_DEFAULT));
      } else {
        issue_wait(g, way, r);
        answer.store(r, std::memory_order_release);
      }
    }
  });
  std::vector<double> us;
  const std::uint32_t base = 0x1000000u * (1 + static_cast<int>(way));
  for (int i = 0; i < kIters; ++i) {
    const std::uint32_t ticket = base + static_cast<std::uint32_t>(i) + 1;
    auto t0 = Clock::now();
    request.store(ticket, std::memory_order_release);
    if (way == Way::kWriteValue) {
      while (*g.word != ticket) {
      }
    } else {
      while (answer.load(std::memory_order_acquire) != ticket) {
      }
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  stop = true;
  server.join();
  std::printf("across threads %-33s median %.2f us\n", way_name(way), median(us));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s probe_kernel.cubin\n", argv[0]);
    return 2;
  }
  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
  MUST(cuCtxSetCurrent(ctx));
  int memops = 0;
  cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
  std::printf("stream memory operations: %d\n", memops);
  CUmodule module;
  MUST(cuModuleLoad(&module, argv[1]));
  Gpu g{};
  MUST(cuModuleGetFunction(&g.empty, module, "empty"));
  MUST(cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING));
  MUST(cuEventCreate(&g.event, CU_EVENT_DISABLE_TIMING));
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  MUST(cuMemHostRegister(page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
  MUST(cuMemHostGetDevicePointer(&g.word_dev, page, 0));
  g.word = static_cast<volatile std::uint32_t*>(page);
  for (int warm = 0; warm < 1000; ++warm) {
    launch(g);
    MUST(cuStreamSynchronize(g.stream));
  }
  for (int round = 0; round < 2; ++round) {
    for (Way w : {Way::kStreamSync, Way::kEventPoll, Way::kQueryRecordPoll, Way::kWriteValue}) {
      same_thread(g, w);
    }
    for (Way w : {Way::kEventPoll, Way::kQueryRecordPoll, Way::kWriteValue}) cross_thread(g, w);
  }
  return 0;
}

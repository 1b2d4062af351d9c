// A CUDA runtime program built with --default-stream per-thread: four host threads launch
// kernels, copy and synchronize on their own per-thread default stream (no stream argument, or
// 0, or cudaStreamPerThread) at the same time. Under the shim the runtime asks cuGetProcAddress
// for the _ptsz/_ptds entry points. Kernels as the test driver implements them
// (tests/testdriver/kernels.cpp). Prints "cudart_per_thread: ... PASS" and exits 0 on success.
#include <cuda_runtime.h>

#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

constexpr const char* kProgram = "cudart_per_thread";
#include "cudart_check.cuh"

extern "C" __global__ void fill_u32(unsigned int* p, unsigned int value, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = value;
}

extern "C" __global__ void increment_i32(int* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] += 1;
}

constexpr int kThreads = 4;

// The exit handler's check: the main thread's per-thread stream still works, and is still the
// stream main used, in an atexit handler. glibc destroys the main thread's thread_local objects
// before the atexit handlers run, and libraries' exit handlers (cudart's teardown, PyTorch's
// cuFFT plan cache) still call the driver then; the shim's per-thread state must outlive them.
unsigned long long g_main_stream_id = 0;
int* g_exit_buffer = nullptr;
constexpr int kExitInts = 1024;

void exit_handler_check() {
  // Not CHECK: calling exit() from an exit handler is undefined.
  unsigned long long id = 0;
  int host[kExitInts] = {};
  bool ok = cudaStreamGetId(cudaStreamPerThread, &id) == cudaSuccess &&
            cudaMemsetAsync(g_exit_buffer, 7, sizeof host, cudaStreamPerThread) == cudaSuccess &&
            cudaMemcpyAsync(host, g_exit_buffer, sizeof host, cudaMemcpyDeviceToHost,
                            cudaStreamPerThread) == cudaSuccess &&
            cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess;
  int bad = 0;
  for (int v : host) bad += v != 0x07070707;
  ok = ok && bad == 0 && id == g_main_stream_id;
  std::printf("cudart_per_thread: exit handler: same_stream=%d wrong=%d %s\n",
              id == g_main_stream_id ? 1 : 0, bad, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) _exit(1);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 50000;
  const int rounds = 5;
  CHECK(cudaSetDevice(0));
  std::atomic<int> wrong{0};
  std::atomic<int> ready{0};
  auto work = [&](int t) {
    CHECK(cudaSetDevice(0));
    const size_t bytes = sizeof(int) * static_cast<size_t>(n);
    int* dev = nullptr;
    int* pinned = nullptr;
    CHECK(cudaMalloc(&dev, bytes));
    CHECK(cudaMallocHost(&pinned, bytes));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    // Start together, so the four threads' streams really are in use at once.
    ++ready;
    while (ready.load() < kThreads) std::this_thread::yield();
    for (int r = 0; r < rounds; ++r) {
      const unsigned base = 1000u * (t + 1) + 100u * r;
      fill_u32<<<(n + 255) / 256, 256>>>(reinterpret_cast<unsigned*>(dev), base, n);
      for (int k = 0; k < t + 2; ++k) increment_i32<<<(n + 255) / 256, 256, 0, 0>>>(dev, n);
      CHECK(cudaGetLastError());
      if (r % 2 == 0) {
        CHECK(cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
        CHECK(cudaEventRecord(done, 0));
        CHECK(cudaEventSynchronize(done));
      } else {
        CHECK(cudaMemcpy(pinned, dev, bytes, cudaMemcpyDeviceToHost));  // _ptds
        CHECK(cudaStreamSynchronize(0));
      }
      const int expect = static_cast<int>(base) + t + 2;
      int bad = 0;
      for (int i = 0; i < n; ++i) bad += pinned[i] != expect;
      if (bad != 0)
        std::printf("cudart_per_thread: thread %d round %d: %d wrong (first %d, expected %d)\n", t,
                    r, bad, pinned[0], expect);
      wrong += bad;
    }
    // The stream is drained: a query must answer cudaSuccess at once.
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    CHECK(cudaStreamQuery(cudaStreamPerThread));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dev));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMalloc(&g_exit_buffer, sizeof(int) * kExitInts));
  CHECK(cudaStreamGetId(cudaStreamPerThread, &g_main_stream_id));
  std::atexit(exit_handler_check);
  const bool ok = wrong == 0;
  std::printf("cudart_per_thread: threads=%d rounds=%d n=%d wrong=%d %s\n", kThreads, rounds, n,
              wrong.load(), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

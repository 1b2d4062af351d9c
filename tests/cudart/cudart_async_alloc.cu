// A CUDA runtime program using stream-ordered allocation and host functions on two streams, built
// by nvcc with its defaults (static cudart). Nothing of mpsshim is linked in.
//
// Each stream runs kIterations rounds of: cudaMallocAsync, copy in from pinned memory, a slow
// kernel, an increment, copy out, cudaLaunchHostFunc, cudaFreeAsync. The host function checks the
// copy-out it follows (it must see the work before it) and writes the input of the next round's
// copy-in, which was queued before the host function ran (work after it must wait for it).
// Then cudaStreamAddCallback, the default pool's attributes and a pool of the program's own.
// Prints "cudart_async_alloc: ... PASS" and exits 0 on success.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

constexpr const char* kProgram = "cudart_async_alloc";
#include "cudart_check.cuh"

// Same names, signatures and semantics as the test driver's kernels (tests/testdriver/kernels.cpp).
extern "C" __global__ void increment_i32(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

extern "C" __global__ void sleep_kernel(int microseconds) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= 1000ull * static_cast<unsigned long long>(microseconds)) break;
    __nanosleep(1000);
  }
}

namespace {

constexpr int kStreams = 2;
constexpr int kIterations = 12;

std::atomic<int> g_failures{0};
std::atomic<int> g_host_functions{0};
std::atomic<int> g_next_round[kStreams];

int value_of(int stream, int round) {
  return 1000 * (stream + 1) + 7 * round;
}

struct Round {
  int stream;
  int round;
  int n;
  int* host_in;   // pinned: the next round's copy-in reads it
  int* host_out;  // pinned: this round's copy-out wrote it
};

void CUDART_CB check_round(void* data) {
  const Round& r = *static_cast<const Round*>(data);
  if (g_next_round[r.stream].fetch_add(1) != r.round) {
    std::printf("cudart_async_alloc: stream %d ran host function %d out of order\n", r.stream,
                r.round);
    ++g_failures;
  }
  const int expect = value_of(r.stream, r.round) + 1;
  for (int i = 0; i < r.n; ++i) {
    if (r.host_out[i] != expect) {
      std::printf("cudart_async_alloc: stream %d round %d: out[%d] = %d, expected %d\n", r.stream,
                  r.round, i, r.host_out[i], expect);
      ++g_failures;
      break;
    }
  }
  for (int i = 0; i < r.n; ++i) r.host_in[i] = value_of(r.stream, r.round + 1);
  ++g_host_functions;
}

struct CallbackSeen {
  cudaStream_t expected_stream;
  std::atomic<int> calls{0};
  std::atomic<int> wrong{0};
};

void CUDART_CB stream_callback(cudaStream_t stream, cudaError_t status, void* data) {
  auto* seen = static_cast<CallbackSeen*>(data);
  if (stream != seen->expected_stream || status != cudaSuccess) ++seen->wrong;
  ++seen->calls;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 4096;
  const size_t bytes = static_cast<size_t>(n) * sizeof(int);
  CHECK(cudaSetDevice(0));
  int pools_supported = 0;
  CHECK(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, 0));

  cudaStream_t streams[kStreams];
  int* host_in[kStreams];
  int* host_out[kStreams];
  static Round rounds[kStreams][kIterations];
  for (int s = 0; s < kStreams; ++s) {
    CHECK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
    CHECK(cudaMallocHost(&host_in[s], bytes));
    CHECK(cudaMallocHost(&host_out[s], bytes));
    for (int i = 0; i < n; ++i) host_in[s][i] = value_of(s, 0);
  }

  const int block = 256;
  const int grid = (n + block - 1) / block;
  for (int round = 0; round < kIterations; ++round) {
    for (int s = 0; s < kStreams; ++s) {
      int* d = nullptr;
      CHECK(cudaMallocAsync(&d, bytes, streams[s]));
      CHECK(cudaMemcpyAsync(d, host_in[s], bytes, cudaMemcpyHostToDevice, streams[s]));
      sleep_kernel<<<1, 1, 0, streams[s]>>>(300);
      increment_i32<<<grid, block, 0, streams[s]>>>(d, n);
      CHECK(cudaGetLastError());
      CHECK(cudaMemcpyAsync(host_out[s], d, bytes, cudaMemcpyDeviceToHost, streams[s]));
      rounds[s][round] = Round{s, round, n, host_in[s], host_out[s]};
      CHECK(cudaLaunchHostFunc(streams[s], check_round, &rounds[s][round]));
      CHECK(cudaFreeAsync(d, streams[s]));
    }
  }
  CallbackSeen seen;
  seen.expected_stream = streams[1];
  CHECK(cudaStreamAddCallback(streams[1], stream_callback, &seen, 0));
  for (int s = 0; s < kStreams; ++s) CHECK(cudaStreamSynchronize(streams[s]));

  // The default pool: its use is this program's own.
  cudaMemPool_t pool;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  std::uint64_t threshold = ~std::uint64_t{0};
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  std::uint64_t threshold_back = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold_back));
  int* held = nullptr;
  CHECK(cudaMallocAsync(&held, bytes, streams[0]));
  CHECK(cudaStreamSynchronize(streams[0]));
  std::uint64_t used_default = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used_default));
  CHECK(cudaFreeAsync(held, streams[0]));

  // A pool of the program's own.
  cudaMemPoolProps props;
  std::memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t own;
  CHECK(cudaMemPoolCreate(&own, &props));
  int* from_own = nullptr;
  CHECK(cudaMallocFromPoolAsync(&from_own, 3 * bytes, own, streams[1]));
  CHECK(cudaMemsetAsync(from_own, 0, 3 * bytes, streams[1]));
  CHECK(cudaStreamSynchronize(streams[1]));
  std::uint64_t used_own = 0;
  CHECK(cudaMemPoolGetAttribute(own, cudaMemPoolAttrUsedMemCurrent, &used_own));
  CHECK(cudaFreeAsync(from_own, streams[1]));
  CHECK(cudaStreamSynchronize(streams[1]));
  std::uint64_t used_own_after = 1;
  CHECK(cudaMemPoolGetAttribute(own, cudaMemPoolAttrUsedMemCurrent, &used_own_after));
  CHECK(cudaMemPoolDestroy(own));

  // An exportable pool (POSIX fds): made, as by the real driver (docs/memory-pools.md).
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  cudaMemPool_t exportable;
  const cudaError_t ipc = cudaMemPoolCreate(&exportable, &props);
  (void)cudaGetLastError();
  if (ipc == cudaSuccess) CHECK(cudaMemPoolDestroy(exportable));

  for (int s = 0; s < kStreams; ++s) {
    CHECK(cudaStreamSynchronize(streams[s]));
    CHECK(cudaStreamDestroy(streams[s]));
    CHECK(cudaFreeHost(host_in[s]));
    CHECK(cudaFreeHost(host_out[s]));
  }

  const bool ok = pools_supported == 1 && g_failures == 0 &&
                  g_host_functions == kStreams * kIterations && seen.calls == 1 &&
                  seen.wrong == 0 && threshold_back == threshold && used_default >= bytes &&
                  used_own == 3 * bytes && used_own_after == 0 && ipc == cudaSuccess;
  std::printf(
      "cudart_async_alloc: n=%d host_functions=%d failures=%d callbacks=%d/%d "
      "used_default=%llu used_own=%llu/%llu ipc=%s %s\n",
      n, g_host_functions.load(), g_failures.load(), seen.calls.load(), seen.wrong.load(),
      static_cast<unsigned long long>(used_default), static_cast<unsigned long long>(used_own),
      static_cast<unsigned long long>(used_own_after), cudaGetErrorName(ipc), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

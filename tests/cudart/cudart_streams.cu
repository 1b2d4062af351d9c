// A CUDA runtime program using two streams, pinned host memory, async copies, events and
// cudaMemset, built by nvcc with its defaults (static cudart). Nothing of mpsshim is linked in.
// Stream 1: y = alpha * x + y (scale_add), twice. Stream 2: p[i] += 1 (increment_i32) three times
// on memory cudaMemset to a byte pattern. Prints "cudart_streams: ... PASS" and exits 0 on success.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

constexpr const char* kProgram = "cudart_streams";
#include "cudart_check.cuh"

// Same names, signatures and semantics as the test driver's kernels (tests/testdriver/kernels.cpp).
extern "C" __global__ void scale_add(float* y, const float* x, float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = alpha * x[i] + y[i];
}

extern "C" __global__ void increment_i32(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 65536;
  const float alpha = 1.5f;
  const size_t fbytes = static_cast<size_t>(n) * sizeof(float);
  const size_t ibytes = static_cast<size_t>(n) * sizeof(int);

  int device = 0;
  CHECK(cudaSetDevice(0));
  CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  std::memset(&prop, 0, sizeof prop);
  CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.multiProcessorCount <= 0 || prop.totalGlobalMem == 0 || prop.major <= 0 ||
      prop.name[0] == '\0') {
    std::printf("cudart_streams: implausible properties sms=%d mem=%zu cc=%d.%d FAIL\n",
                prop.multiProcessorCount, prop.totalGlobalMem, prop.major, prop.minor);
    return 1;
  }

  float *hx = nullptr, *hy = nullptr;
  int* hp = nullptr;
  CHECK(cudaMallocHost(&hx, fbytes));
  CHECK(cudaMallocHost(&hy, fbytes));
  CHECK(cudaMallocHost(&hp, ibytes));
  for (int i = 0; i < n; ++i) {
    hx[i] = 0.125f * static_cast<float>(i % 1000) + 1.0f;
    hy[i] = static_cast<float>(i % 77) - 3.5f;
    hp[i] = -12345;
  }
  // Host reference, computed before the device overwrites hy in place.
  float* expect_y = static_cast<float*>(std::malloc(fbytes));
  for (int i = 0; i < n; ++i) expect_y[i] = std::fmaf(alpha, hx[i], std::fmaf(alpha, hx[i], hy[i]));

  float *dx = nullptr, *dy = nullptr;
  int* dp = nullptr;
  CHECK(cudaMalloc(&dx, fbytes));
  CHECK(cudaMalloc(&dy, fbytes));
  CHECK(cudaMalloc(&dp, ibytes));

  cudaStream_t s1, s2;
  CHECK(cudaStreamCreate(&s1));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t start, stop, copied;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));

  const int block = 256;
  const int grid = (n + block - 1) / block;

  // Stream 1: copies in, two scale_adds, copy out, timed.
  CHECK(cudaEventRecord(start, s1));
  CHECK(cudaMemcpyAsync(dx, hx, fbytes, cudaMemcpyHostToDevice, s1));
  CHECK(cudaMemcpyAsync(dy, hy, fbytes, cudaMemcpyHostToDevice, s1));
  CHECK(cudaEventRecord(copied, s1));
  scale_add<<<grid, block, 0, s1>>>(dy, dx, alpha, n);
  scale_add<<<grid, block, 0, s1>>>(dy, dx, alpha, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(hy, dy, fbytes, cudaMemcpyDeviceToHost, s1));
  CHECK(cudaEventRecord(stop, s1));

  // Stream 2: memset to 0x01010101, three increments, copy out.
  CHECK(cudaMemsetAsync(dp, 0x01, ibytes, s2));
  CHECK(cudaStreamWaitEvent(s2, copied, 0));
  for (int r = 0; r < 3; ++r) increment_i32<<<grid, block, 0, s2>>>(dp, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(hp, dp, ibytes, cudaMemcpyDeviceToHost, s2));

  CHECK(cudaEventSynchronize(stop));
  float ms = -1.0f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaStreamQuery(s1));

  // A synchronous memset and copy on the legacy default stream too.
  CHECK(cudaMemset(dx, 0, fbytes));
  float back = -1.0f;
  CHECK(cudaMemcpy(&back, dx + n - 1, sizeof back, cudaMemcpyDeviceToHost));

  int wrong_y = 0, wrong_p = 0;
  for (int i = 0; i < n; ++i) {
    if (hy[i] != expect_y[i]) {
      if (wrong_y < 5)
        std::printf("cudart_streams: y[%d] = %.9g, expected %.9g\n", i, hy[i], expect_y[i]);
      ++wrong_y;
    }
    if (hp[i] != 0x01010101 + 3) {
      if (wrong_p < 5)
        std::printf("cudart_streams: p[%d] = %d, expected %d\n", i, hp[i], 0x01010101 + 3);
      ++wrong_p;
    }
  }
  const bool ok = wrong_y == 0 && wrong_p == 0 && back == 0.0f && ms >= 0.0f;

  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaEventDestroy(copied));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(dp));
  CHECK(cudaFreeHost(hx));
  CHECK(cudaFreeHost(hy));
  CHECK(cudaFreeHost(hp));
  std::free(expect_y);

  std::printf(
      "cudart_streams: device=\"%s\" sms=%d cc=%d.%d n=%d ms=%.3f wrong_y=%d wrong_p=%d "
      "memset=%g %s\n",
      prop.name, prop.multiProcessorCount, prop.major, prop.minor, n, ms, wrong_y, wrong_p, back,
      ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// A plain CUDA runtime program, built by nvcc with its defaults (static cudart): cudaMalloc,
// cudaMemcpy, one <<<>>> launch, cudaDeviceSynchronize, cudaMemcpy back, cudaFree. It contains
// nothing of mpsshim; under LD_PRELOAD=libmpsshim.so the runtime's dlopen("libcuda.so.1") finds
// the shim. Prints "cudart_vecadd: ... PASS" and exits 0 only when every element is right.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr const char* kProgram = "cudart_vecadd";
#include "cudart_check.cuh"

// Same name, signature and semantics as the test driver's vector_add
// (tests/testdriver/kernels.cpp).
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::vector<float> a(n), b(n), c(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = 0.5f * static_cast<float>(i);
    b[i] = static_cast<float>(n - i) + 0.25f;
  }

  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices < 1) {
    std::printf("cudart_vecadd: no device FAIL\n");
    return 1;
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  CHECK(cudaMalloc(&da, bytes));
  CHECK(cudaMalloc(&db, bytes));
  CHECK(cudaMalloc(&dc, bytes));
  CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));

  // Occupancy and attribute queries as a tuned launch makes them (cuKernelGetAttribute,
  // cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags through the runtime).
  cudaFuncAttributes attributes;
  CHECK(cudaFuncGetAttributes(&attributes, vector_add));
  int min_grid = 0, block = 0, blocks_per_sm = 0;
  CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, vector_add, 0, 0));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, vector_add, block, 0));
  if (attributes.maxThreadsPerBlock <= 0 || block <= 0 || block > attributes.maxThreadsPerBlock ||
      blocks_per_sm <= 0) {
    std::printf("cudart_vecadd: implausible maxThreadsPerBlock=%d block=%d blocks_per_sm=%d FAIL\n",
                attributes.maxThreadsPerBlock, block, blocks_per_sm);
    return 1;
  }
  const unsigned grid = static_cast<unsigned>((n + block - 1) / block);
  vector_add<<<grid, block>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));

  // The same sum again through cudaLaunchKernelEx (cuLaunchKernelEx), into a second buffer.
  std::vector<float> c2(n, -1.0f);
  float* dc2 = nullptr;
  CHECK(cudaMalloc(&dc2, bytes));
  CHECK(cudaMemset(dc2, 0xff, bytes));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(static_cast<unsigned>(block));
  CHECK(cudaLaunchKernelEx(&config, vector_add, static_cast<const float*>(da),
                           static_cast<const float*>(db), dc2, n));
  CHECK(cudaMemcpy(c2.data(), dc2, bytes, cudaMemcpyDeviceToHost));
  size_t free_bytes = 0, total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  CHECK(cudaFree(dc2));
  // Tears the primary context down; the runtime unloads its library at exit afterwards.
  CHECK(cudaDeviceReset());

  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i] || c2[i] != a[i] + b[i]) {
      if (wrong < 5) {
        std::printf("cudart_vecadd: c[%d] = %g, c2[%d] = %g, expected %g\n", i, c[i], i, c2[i],
                    a[i] + b[i]);
      }
      ++wrong;
    }
  }
  const bool ok = wrong == 0 && total_bytes > 0 && free_bytes <= total_bytes;
  std::printf("cudart_vecadd: devices=%d n=%d block=%d blocks_per_sm=%d total=%zu wrong=%d %s\n",
              devices, n, block, blocks_per_sm, total_bytes, wrong, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

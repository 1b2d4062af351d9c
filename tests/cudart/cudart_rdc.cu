// A device-linked (-rdc=true) CUDA runtime program of two translation units, built by nvcc with
// its defaults (static cudart). The runtime loads its image from a version-2 fat-binary wrapper
// (docs/private-tables.md, "The wrapper"); under the shim that becomes several containers shipped
// back to back and re-wrapped by the server. It also launches again after cudaDeviceReset: the
// runtime keeps its library and kernel handles across the reset and expects them to work in the
// new primary context. Prints "cudart_rdc: ... PASS" and exits 0 only when every element is right.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr const char* kProgram = "cudart_rdc";
#include "cudart_check.cuh"

__device__ float add_values(float a, float b);  // cudart_rdc_add.cu

// Same name, signature and semantics as the test driver's vector_add
// (tests/testdriver/kernels.cpp).
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = add_values(a[i], b[i]);
}

namespace {

// One round: fresh buffers, one launch, the result back; returns the number of wrong elements,
// or -1 when a call failed (already reported).
int add_round(int n, int round) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::vector<float> a(n), b(n), c(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 1000) + 0.5f * static_cast<float>(round);
    b[i] = static_cast<float>(n - i) * 0.25f;
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
#define CHECK_ROUND(call)                                                     \
  do {                                                                        \
    cudaError_t err_ = (call);                                                \
    if (err_ != cudaSuccess) {                                                \
      std::printf("cudart_rdc: round %d: %s failed: %s (%d)\n", round, #call, \
                  cudaGetErrorName(err_), static_cast<int>(err_));            \
      return -1;                                                              \
    }                                                                         \
  } while (0)
  CHECK_ROUND(cudaMalloc(&da, bytes));
  CHECK_ROUND(cudaMalloc(&db, bytes));
  CHECK_ROUND(cudaMalloc(&dc, bytes));
  CHECK_ROUND(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_ROUND(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  vector_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CHECK_ROUND(cudaGetLastError());
  CHECK_ROUND(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
  CHECK_ROUND(cudaFree(da));
  CHECK_ROUND(cudaFree(db));
  CHECK_ROUND(cudaFree(dc));
#undef CHECK_ROUND
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) {
      if (wrong < 5) {
        std::printf("cudart_rdc: round %d: c[%d] = %g, expected %g\n", round, i, c[i], a[i] + b[i]);
      }
      ++wrong;
    }
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 50000;
  const int first = add_round(n, 1);
  if (first < 0) return 1;
  // The primary context goes away; the runtime's kernels must work in the next one.
  CHECK(cudaDeviceReset());
  const int second = add_round(n, 2);
  if (second < 0) return 1;
  CHECK(cudaDeviceReset());
  const bool ok = first == 0 && second == 0;
  std::printf("cudart_rdc: n=%d wrong_before_reset=%d wrong_after_reset=%d %s\n", n, first, second,
              ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

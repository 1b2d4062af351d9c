// c = a + b with cudaMalloc, cudaMemcpy and one launch: the smallest CUDA runtime program.
static const char* const kProgram = "rt_vector_add";
#include <vector>

#include "rt_common.cuh"

__global__ void vector_add(const float* a, const float* b, float* c, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    c[i] = a[i] + b[i];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : (1 << 22) + 3;
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  std::vector<float> a(n), b(n), c(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = 0.25f * static_cast<float>(i % 4093);
    b[i] = static_cast<float>(n - i) * 0.5f;
  }
  float *da, *db, *dc;
  RT_CHECK(cudaMalloc(&da, bytes));
  RT_CHECK(cudaMalloc(&db, bytes));
  RT_CHECK(cudaMalloc(&dc, bytes));
  RT_CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  RT_CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  vector_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += c[i] != a[i] + b[i];
  RT_CHECK(cudaFree(da));
  RT_CHECK(cudaFree(db));
  RT_CHECK(cudaFree(dc));
  return RT_REPORT(wrong == 0, "n=%d wrong=%d checksum=%016llx", n, wrong,
                   static_cast<unsigned long long>(rt_checksum(c.data(), bytes)));
}

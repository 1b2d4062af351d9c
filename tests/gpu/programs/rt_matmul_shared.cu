// C = A * B with 16x16 tiles staged through shared memory. The inputs are small multiples of
// 1/4, so every partial sum is exact in float and the CPU reference matches bit for bit.
static const char* const kProgram = "rt_matmul_shared";
#include <vector>

#include "rt_common.cuh"

constexpr int kTile = 16;

__global__ void matmul_shared(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float sum = 0.0f;
  for (int t = 0; t < K; t += kTile) {
    a_tile[threadIdx.y][threadIdx.x] =
        row < M && t + threadIdx.x < K ? A[row * K + t + threadIdx.x] : 0.0f;
    b_tile[threadIdx.y][threadIdx.x] =
        col < N && t + threadIdx.y < K ? B[(t + threadIdx.y) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < kTile; ++k) sum += a_tile[threadIdx.y][k] * b_tile[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = sum;
}

int main() {
  const int M = 500, N = 333, K = 260;  // not multiples of the tile: edges are exercised
  std::vector<float> A(M * K), B(K * N), C(M * N, -1.0f), expect(M * N, 0.0f);
  for (int i = 0; i < M * K; ++i) A[i] = 0.25f * static_cast<float>(i % 9 - 4);
  for (int i = 0; i < K * N; ++i) B[i] = 0.25f * static_cast<float>(i % 7 - 3);
  for (int r = 0; r < M; ++r)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < N; ++c) expect[r * N + c] += A[r * K + k] * B[k * N + c];
  float *dA, *dB, *dC;
  RT_CHECK(cudaMalloc(&dA, sizeof(float) * A.size()));
  RT_CHECK(cudaMalloc(&dB, sizeof(float) * B.size()));
  RT_CHECK(cudaMalloc(&dC, sizeof(float) * C.size()));
  RT_CHECK(cudaMemcpy(dA, A.data(), sizeof(float) * A.size(), cudaMemcpyHostToDevice));
  RT_CHECK(cudaMemcpy(dB, B.data(), sizeof(float) * B.size(), cudaMemcpyHostToDevice));
  dim3 block(kTile, kTile), grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
  matmul_shared<<<grid, block>>>(dA, dB, dC, M, N, K);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaDeviceSynchronize());
  RT_CHECK(cudaMemcpy(C.data(), dC, sizeof(float) * C.size(), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < M * N; ++i) wrong += C[i] != expect[i];
  RT_CHECK(cudaFree(dA));
  RT_CHECK(cudaFree(dB));
  RT_CHECK(cudaFree(dC));
  return RT_REPORT(
      wrong == 0, "m=%d n=%d k=%d wrong=%d checksum=%016llx", M, N, K, wrong,
      static_cast<unsigned long long>(rt_checksum(C.data(), sizeof(float) * C.size())));
}

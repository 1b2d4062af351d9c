// Row-major C(MxN) = A(MxK) * B(KxN), one TILE x TILE output tile per block, staged through
// shared memory. Launch with blockDim = (TILE, TILE) and grid = (ceil(N/TILE), ceil(M/TILE)).

namespace {
constexpr int kTile = 16;  // the host programs launch 16x16 blocks: keep in sync
}

extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N,
                                        int K) {
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float sum = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int ak = k0 + threadIdx.x;
    const int bk = k0 + threadIdx.y;
    a_tile[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
    b_tile[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
    __syncthreads();
    // Fused, in k order: the same bits as the CPU test driver's std::fma loop.
    for (int k = 0; k < kTile; ++k) sum = fmaf(a_tile[threadIdx.y][k], b_tile[k][threadIdx.x], sum);
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = sum;
}

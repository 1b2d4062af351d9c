// A CUTLASS-style TMA copy, natively and under the shim: a host-encoded 2D tensor map
// (cuTensorMapEncodeTiled, driver API) that kernels use with the Hopper bulk tensor copies
// (cp.async.bulk.tensor, through libcu++'s cuda::device::experimental wrappers) to move 32 x 32
// tiles global -> shared (completed on an mbarrier) and, after each element is changed in shared
// memory, shared -> global through a second map. Under the shim the server's driver encodes the
// 128 bytes (docs/cuda-runtime.md); the kernel reads them as natively. Every result is a field, so
// the GPU suite compares the shim's run with the driver's. Exit 77 without a GPU.
static const char* const kProgram = "rt_tma_copy";
#include <cuda.h>
#include <cuda/barrier>

#include <vector>

#include "rt_common.cuh"

namespace cde = cuda::device::experimental;
using Barrier = cuda::barrier<cuda::thread_scope_block>;

constexpr int kTile = 32;
constexpr int kWidth = 512;   // elements per row
constexpr int kHeight = 256;  // rows

__global__ void tile_step(const __grid_constant__ CUtensorMap in,
                          const __grid_constant__ CUtensorMap out) {
  __shared__ alignas(128) int tile[kTile][kTile];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ Barrier bar;
  const int x = blockIdx.x * kTile, y = blockIdx.y * kTile;
  if (threadIdx.x == 0) {
    init(&bar, blockDim.x);
    cde::fence_proxy_async_shared_cta();
  }
  __syncthreads();
  Barrier::arrival_token token;
  if (threadIdx.x == 0) {
    cde::cp_async_bulk_tensor_2d_global_to_shared(&tile, &in, x, y, bar);
    token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(tile));
  } else {
    token = bar.arrive();
  }
  bar.wait(std::move(token));
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    int& v = tile[i / kTile][i % kTile];
    v = v * 3 + (x + i % kTile) - (y + i / kTile);
  }
  cde::fence_proxy_async_shared_cta();
  __syncthreads();
  if (threadIdx.x == 0) {
    cde::cp_async_bulk_tensor_2d_shared_to_global(&out, x, y, &tile);
    cde::cp_async_bulk_commit_group();
    cde::cp_async_bulk_wait_group_read<0>();
  }
}

CUresult encode(CUtensorMap* map, int* base) {
  const cuuint64_t dims[2] = {kWidth, kHeight};
  const cuuint64_t strides[1] = {kWidth * sizeof(int)};
  const cuuint32_t box[2] = {kTile, kTile};
  const cuuint32_t element_strides[2] = {1, 1};
  return cuTensorMapEncodeTiled(map, CU_TENSOR_MAP_DATA_TYPE_INT32, 2, base, dims, strides, box,
                                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 77;
  RT_CHECK(cudaSetDevice(0));
  const std::size_t count = std::size_t{kWidth} * kHeight;
  std::vector<int> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<int>((i * 2654435761u) % 100003);
  int *in = nullptr, *out = nullptr;
  RT_CHECK(cudaMalloc(&in, count * sizeof(int)));
  RT_CHECK(cudaMalloc(&out, count * sizeof(int)));
  RT_CHECK(cudaMemcpy(in, host.data(), count * sizeof(int), cudaMemcpyHostToDevice));
  RT_CHECK(cudaMemset(out, 0, count * sizeof(int)));
  alignas(64) CUtensorMap in_map{}, out_map{};
  const int encoded_in = static_cast<int>(encode(&in_map, in));
  const int encoded_out = static_cast<int>(encode(&out_map, out));
  // The driver's own checks: a base that is not 16-byte aligned is refused.
  alignas(64) CUtensorMap bad{};
  const int misaligned = static_cast<int>(encode(&bad, in + 1));
  int wrong = -1;
  if (encoded_in == CUDA_SUCCESS && encoded_out == CUDA_SUCCESS) {
    tile_step<<<dim3(kWidth / kTile, kHeight / kTile), 128>>>(in_map, out_map);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaDeviceSynchronize());
    std::vector<int> got(count);
    RT_CHECK(cudaMemcpy(got.data(), out, count * sizeof(int), cudaMemcpyDeviceToHost));
    wrong = 0;
    for (int r = 0; r < kHeight; ++r) {
      for (int c = 0; c < kWidth; ++c) {
        const std::size_t i = std::size_t{static_cast<unsigned>(r)} * kWidth + c;
        wrong += got[i] != host[i] * 3 + c - r;
      }
    }
  }
  const bool ok = encoded_in == 0 && encoded_out == 0 && wrong == 0 && misaligned != 0;
  return RT_REPORT(ok, "encoded=%d/%d misaligned=%d wrong=%d", encoded_in, encoded_out, misaligned,
                   wrong);
}

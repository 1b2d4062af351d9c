// A cooperative launch: every block of the grid is resident at once (grid sized by
// cudaOccupancyMaxActiveBlocksPerMultiprocessor x SM count), and grid.sync() separates phases
// in which blocks read what other blocks wrote. The data size does not depend on the grid, so
// the checksum is the same whatever SM count the device (or the client's quota) reports.
static const char* const kProgram = "rt_cooperative";
#include <cooperative_groups.h>

#include <vector>

#include "rt_common.cuh"

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

__global__ void phases(unsigned* a, unsigned* b, unsigned* block_sums, unsigned* total, int n) {
  cg::grid_group grid = cg::this_grid();
  const int stride = gridDim.x * blockDim.x;
  const int first = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = first; i < n; i += stride) a[i] = i * 2654435761u;
  grid.sync();
  // Each element reads a neighbour written by (usually) another block.
  for (int i = first; i < n; i += stride) b[i] = a[(i + 4099) % n] ^ a[i];
  grid.sync();
  if (threadIdx.x == 0) {
    unsigned sum = 0;
    for (int i = blockIdx.x; i < n; i += gridDim.x) sum += b[i];
    block_sums[blockIdx.x] = sum;
  }
  grid.sync();
  if (grid.thread_rank() == 0) {
    unsigned sum = 0;
    for (unsigned g = 0; g < gridDim.x; ++g) sum += block_sums[g];
    *total = sum;
  }
}

int main() {
  const int n = 1 << 20;
  int cooperative = 0, sms = 0, per_sm = 0;
  RT_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, 0));
  RT_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  RT_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, phases, kThreads, 0));
  const int blocks = per_sm * sms;
  if (cooperative != 1 || blocks <= 0) {
    std::printf("%s: cooperative=%d sms=%d per_sm=%d FAIL\n", kProgram, cooperative, sms, per_sm);
    return 1;
  }
  unsigned *a, *b, *block_sums, *total;
  RT_CHECK(cudaMalloc(&a, sizeof(unsigned) * n));
  RT_CHECK(cudaMalloc(&b, sizeof(unsigned) * n));
  RT_CHECK(cudaMalloc(&block_sums, sizeof(unsigned) * blocks));
  RT_CHECK(cudaMalloc(&total, sizeof(unsigned)));
  int count = n;
  void* args[] = {&a, &b, &block_sums, &total, &count};
  RT_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(phases), blocks, kThreads, args));
  RT_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned> got(n);
  unsigned got_total = 0;
  RT_CHECK(cudaMemcpy(got.data(), b, sizeof(unsigned) * n, cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(&got_total, total, sizeof got_total, cudaMemcpyDeviceToHost));
  int wrong = 0;
  unsigned expect_total = 0;
  for (int i = 0; i < n; ++i) {
    const unsigned v = (static_cast<unsigned>((i + 4099) % n) * 2654435761u) ^ (i * 2654435761u);
    wrong += got[i] != v;
    expect_total += v;
  }
  for (unsigned* p : {a, b, block_sums, total}) RT_CHECK(cudaFree(p));
  const bool ok = wrong == 0 && got_total == expect_total;
  return RT_REPORT(ok, "n=%d wrong=%d total=%u checksum=%016llx blocks=%d sms=%d", n, wrong,
                   got_total, static_cast<unsigned long long>(rt_checksum(got.data(), 4ull * n)),
                   blocks, sms);
}

// Stream-ordered allocation: cudaMallocAsync / cudaFreeAsync on two streams in a loop, each
// block filled by a kernel and copied back before it is freed; the default pool must report
// reserved memory while a block is live.
static const char* const kProgram = "rt_malloc_async";
#include <vector>

#include "rt_common.cuh"

__global__ void fill(unsigned* p, unsigned seed, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = seed ^ (i * 2246822519u);
}

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  constexpr int kStreams = 2;
  cudaStream_t streams[kStreams];
  unsigned* host[kStreams];
  const int max_n = 1 << 18;
  for (int s = 0; s < kStreams; ++s) {
    RT_CHECK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
    RT_CHECK(cudaMallocHost(&host[s], sizeof(unsigned) * max_n));
  }
  cudaMemPool_t pool;
  RT_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));

  // Reserved memory while one block is live.
  unsigned* live;
  RT_CHECK(cudaMallocAsync(&live, 8 << 20, streams[0]));
  RT_CHECK(cudaStreamSynchronize(streams[0]));
  unsigned long long reserved = 0, used = 0;
  RT_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  RT_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  RT_CHECK(cudaFreeAsync(live, streams[0]));

  int wrong = 0;
  std::uint64_t checksum = 1469598103934665603ull;
  for (int it = 0; it < iterations; ++it) {
    int sizes[kStreams];
    for (int s = 0; s < kStreams; ++s) {
      sizes[s] = 1024 + ((it * 7919 + s * 104729) % (max_n - 1024));
      unsigned* p;
      RT_CHECK(cudaMallocAsync(&p, sizeof(unsigned) * sizes[s], streams[s]));
      fill<<<64, 256, 0, streams[s]>>>(p, it * 31u + s, sizes[s]);
      RT_CHECK_LAUNCH();
      RT_CHECK(cudaMemcpyAsync(host[s], p, sizeof(unsigned) * sizes[s], cudaMemcpyDeviceToHost,
                               streams[s]));
      RT_CHECK(cudaFreeAsync(p, streams[s]));
    }
    for (int s = 0; s < kStreams; ++s) {
      RT_CHECK(cudaStreamSynchronize(streams[s]));
      for (int i = 0; i < sizes[s]; ++i)
        wrong += host[s][i] != ((it * 31u + s) ^ (i * 2246822519u));
      checksum = rt_checksum(host[s], sizeof(unsigned) * sizes[s], checksum);
    }
  }
  for (int s = 0; s < kStreams; ++s) {
    RT_CHECK(cudaStreamDestroy(streams[s]));
    RT_CHECK(cudaFreeHost(host[s]));
  }
  const bool ok = wrong == 0 && reserved > 0 && used >= (8u << 20);
  return RT_REPORT(ok, "iterations=%d wrong=%d reserved_positive=%d used_ok=%d checksum=%016llx",
                   iterations, wrong, reserved > 0 ? 1 : 0, used >= (8u << 20) ? 1 : 0,
                   static_cast<unsigned long long>(checksum));
}

// Four host threads, each with its own stream and buffers, interleaving copies and kernels on
// the one context; every thread's results must be its own and correct.
static const char* const kProgram = "rt_host_threads";
#include <atomic>
#include <thread>
#include <vector>

#include "rt_common.cuh"

constexpr int kThreads = 4;
constexpr int kRounds = 40;

__global__ void affine(unsigned* p, unsigned mul, unsigned add, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = p[i] * mul + add;
}

int main() {
  const int n = 1 << 18;
  const size_t bytes = sizeof(unsigned) * n;
  RT_CHECK(cudaSetDevice(0));
  std::atomic<int> wrong{0};
  std::vector<std::uint64_t> checksums(kThreads);
  auto work = [&](int t) {
    RT_CHECK(cudaSetDevice(0));
    cudaStream_t stream;
    RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned *host, *dev;
    RT_CHECK(cudaMallocHost(&host, bytes));
    RT_CHECK(cudaMalloc(&dev, bytes));
    std::vector<unsigned> expect(n), pageable(n);  // unsigned: wraps as on the GPU
    for (int i = 0; i < n; ++i) pageable[i] = expect[i] = host[i] = i * (t + 1u);
    std::uint64_t checksum = 1469598103934665603ull;
    for (int r = 0; r < kRounds; ++r) {
      const unsigned mul = 1 + (r + t) % 3, add = t * 100 + r;
      // Alternate pinned async and pageable copies.
      if (r % 2 == 0) {
        RT_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
      } else {
        RT_CHECK(cudaMemcpyAsync(dev, pageable.data(), bytes, cudaMemcpyHostToDevice, stream));
      }
      affine<<<64, 256, 0, stream>>>(dev, mul, add, n);
      RT_CHECK_LAUNCH();
      RT_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream));
      RT_CHECK(cudaStreamSynchronize(stream));
      int bad = 0;
      for (int i = 0; i < n; ++i) {
        expect[i] = expect[i] * mul + add;
        bad += host[i] != expect[i];
      }
      wrong += bad;
      std::copy(host, host + n, pageable.begin());
      checksum = rt_checksum(host, bytes, checksum);
      std::this_thread::yield();
    }
    checksums[t] = checksum;
    RT_CHECK(cudaStreamDestroy(stream));
    RT_CHECK(cudaFreeHost(host));
    RT_CHECK(cudaFree(dev));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  const std::uint64_t all = rt_checksum(checksums.data(), sizeof(std::uint64_t) * kThreads);
  return RT_REPORT(wrong == 0, "threads=%d rounds=%d wrong=%d checksum=%016llx", kThreads, kRounds,
                   wrong.load(), static_cast<unsigned long long>(all));
}

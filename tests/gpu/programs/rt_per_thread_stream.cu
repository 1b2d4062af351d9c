// Built with --default-stream per-thread: launches and copies without a stream argument go to
// the calling thread's own default stream. Four threads each run their own work on it; then
// thread 0 keeps its default stream busy with a 300 ms kernel while thread 1 runs and
// synchronizes its own work, which must not wait for thread 0's kernel (independent=1).
static const char* const kProgram = "rt_per_thread_stream";
#include <atomic>
#include <thread>
#include <vector>

#include "rt_common.cuh"

constexpr int kThreads = 4;

__global__ void fill(unsigned* p, unsigned seed, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = seed * 2654435761u + i;
}

__global__ void mix(unsigned* p, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = (p[i] ^ k) * 16777619u;
}

__global__ void busy(unsigned long long ns) {
  rt_spin_ns(ns);
}

unsigned expected(unsigned seed, int i, int rounds) {
  unsigned v = seed * 2654435761u + i;
  for (int r = 0; r < rounds; ++r) v = (v ^ (seed + r)) * 16777619u;
  return v;
}

int main() {
  const int n = 1 << 18, rounds = 20;
  const size_t bytes = sizeof(unsigned) * n;
  RT_CHECK(cudaSetDevice(0));
  std::atomic<int> wrong{0};
  std::vector<std::uint64_t> checksums(kThreads);
  auto work = [&](int t) {
    unsigned* dev;
    RT_CHECK(cudaMalloc(&dev, bytes));
    std::vector<unsigned> host(n);
    const unsigned seed = 1000u * (t + 1);
    fill<<<64, 256>>>(dev, seed, n);  // the per-thread default stream
    for (int r = 0; r < rounds; ++r) mix<<<64, 256>>>(dev, seed + r, n);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaMemcpyAsync(host.data(), dev, bytes, cudaMemcpyDeviceToHost, 0));
    RT_CHECK(cudaStreamSynchronize(0));
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += host[i] != expected(seed, i, rounds);
    wrong += bad;
    checksums[t] = rt_checksum(host.data(), bytes);
    RT_CHECK(cudaFree(dev));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();

  // Independence of two threads' default streams.
  // (cudaMalloc/cudaFree stay outside: cudaFree may synchronize the whole device.)
  unsigned* quick_dev;
  RT_CHECK(cudaMalloc(&quick_dev, sizeof(unsigned)));
  RT_CHECK(cudaDeviceSynchronize());
  std::atomic<int> stage{0};
  bool busy_still_running = false;
  std::thread busy_thread([&] {
    busy<<<1, 1>>>(300ull * 1000 * 1000);
    RT_CHECK_LAUNCH();
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    busy_still_running = cudaStreamQuery(cudaStreamPerThread) == cudaErrorNotReady;
    RT_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  });
  std::thread quick_thread([&] {
    while (stage.load() != 1) std::this_thread::yield();
    fill<<<1, 32>>>(quick_dev, 7, 1);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    stage = 2;
  });
  busy_thread.join();
  quick_thread.join();
  RT_CHECK(cudaDeviceSynchronize());
  RT_CHECK(cudaFree(quick_dev));

  const std::uint64_t all = rt_checksum(checksums.data(), sizeof(std::uint64_t) * kThreads);
  const bool ok = wrong == 0 && busy_still_running;
  return RT_REPORT(ok, "threads=%d wrong=%d independent=%d checksum=%016llx", kThreads,
                   wrong.load(), busy_still_running ? 1 : 0, static_cast<unsigned long long>(all));
}

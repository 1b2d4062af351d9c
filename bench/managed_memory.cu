// Managed memory, timed from the application's side: a STREAM-style triad (a = b + s * c) over
// cudaMallocManaged arrays the GPU reads and writes, after the host initialised them, and a
// CPU/GPU ping-pong (the host changes one int, a kernel changes it back, the host waits and
// checks). Natively the pages migrate to the GPU and back; under mpsshim they stay in host
// memory the device maps (docs/host-memory.md), so the triad runs at the host link's speed.
// Prints "benchmark,metric,size_bytes,value,unit" CSV lines and a result line
// "managed_memory: ... PASS|FAIL" (FAIL only when a call fails or a result is wrong).
//
// usage: managed_memory [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess) {                                                            \
      std::printf("managed_memory: %s failed: %s FAIL\n", #call, cudaGetErrorName(err_)); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

__global__ void triad(float* a, const float* b, const float* c, float s, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    a[i] = b[i] + s * c[i];
}

__global__ void answer(volatile int* cell) {
  *cell = -*cell;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const size_t n = quick ? (size_t{1} << 22) : (size_t{1} << 26);  // 16 MiB or 256 MiB per array
  const size_t bytes = n * sizeof(float);
  float *a, *b, *c;
  CHECK(cudaMallocManaged(&a, bytes));
  CHECK(cudaMallocManaged(&b, bytes));
  CHECK(cudaMallocManaged(&c, bytes));
  for (size_t i = 0; i < n; ++i) {
    b[i] = static_cast<float>(i % 1000);
    c[i] = 0.5f;
  }
  // First touch by the GPU (natively: the migration), then steady state.
  auto start = Clock::now();
  triad<<<1024, 256>>>(a, b, c, 2.0f, n);
  CHECK(cudaDeviceSynchronize());
  const double first = seconds_since(start);
  const int reps = quick ? 5 : 20;
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    start = Clock::now();
    triad<<<1024, 256>>>(a, b, c, 2.0f, n);
    CHECK(cudaDeviceSynchronize());
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  size_t wrong = 0;
  for (size_t i = 0; i < n; i += 4099) wrong += a[i] != static_cast<float>(i % 1000) + 1.0f;
  std::printf("managed_memory,triad_first_touch_gbps,%zu,%.2f,GB/s\n", 3 * bytes,
              3.0 * bytes / first / 1e9);
  std::printf("managed_memory,triad_gbps,%zu,%.2f,GB/s\n", 3 * bytes, 3.0 * bytes / median / 1e9);

  // Ping-pong: one int, the host and a kernel in turn.
  int* cell;
  CHECK(cudaMallocManaged(&cell, sizeof(int)));
  const int rounds = quick ? 200 : 2000;
  std::vector<double> trips;
  for (int r = 1; r <= rounds; ++r) {
    start = Clock::now();
    *cell = r;
    answer<<<1, 1>>>(cell);
    CHECK(cudaDeviceSynchronize());
    wrong += *cell != -r;
    trips.push_back(seconds_since(start) * 1e6);
  }
  std::sort(trips.begin(), trips.end());
  std::printf("managed_memory,pingpong_median_us,4,%.2f,us\n", trips[trips.size() / 2]);
  std::printf("managed_memory,pingpong_p99_us,4,%.2f,us\n", trips[trips.size() * 99 / 100]);
  CHECK(cudaFree(cell));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(c));
  std::printf("managed_memory: triad_gbps=%.1f pingpong_us=%.1f wrong=%zu %s\n",
              3.0 * bytes / median / 1e9, trips[trips.size() / 2], wrong,
              wrong == 0 ? "PASS" : "FAIL");
  return wrong == 0 ? 0 : 1;
}

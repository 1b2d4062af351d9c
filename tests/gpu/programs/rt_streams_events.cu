// Several streams with async copies from pinned memory, events and cudaStreamWaitEvent.
// Stream k scales its own slice; a consumer stream waits on an event recorded after a slow
// producer kernel and must see the producer's values (ordering), and cudaEventElapsedTime
// across the timed stream must be positive.
static const char* const kProgram = "rt_streams_events";
#include <vector>

#include "rt_common.cuh"

constexpr int kStreams = 4;

__global__ void scale(int* p, int factor, int add, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = p[i] * factor + add;
}

// Slow on purpose: a consumer that does not wait would read the old values.
__global__ void slow_produce(int* p, int value, int n, unsigned long long spin_ns) {
  if (threadIdx.x == 0) rt_spin_ns(spin_ns);
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = value + i;
}

__global__ void consume(const int* in, int* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i] * 2;
}

int main() {
  const int n = 1 << 20;
  const size_t bytes = sizeof(int) * n;
  cudaStream_t streams[kStreams];
  int* host[kStreams];
  int* dev[kStreams];
  for (int s = 0; s < kStreams; ++s) {
    RT_CHECK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
    RT_CHECK(cudaMallocHost(&host[s], bytes));
    RT_CHECK(cudaMalloc(&dev[s], bytes));
    for (int i = 0; i < n; ++i) host[s][i] = i ^ (s * 7919);
  }
  cudaEvent_t start, stop;
  RT_CHECK(cudaEventCreate(&start));
  RT_CHECK(cudaEventCreate(&stop));
  RT_CHECK(cudaEventRecord(start, streams[0]));
  for (int s = 0; s < kStreams; ++s) {
    RT_CHECK(cudaMemcpyAsync(dev[s], host[s], bytes, cudaMemcpyHostToDevice, streams[s]));
    for (int r = 0; r < 3; ++r) scale<<<256, 256, 0, streams[s]>>>(dev[s], 3, s + r, n);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaMemcpyAsync(host[s], dev[s], bytes, cudaMemcpyDeviceToHost, streams[s]));
  }
  RT_CHECK(cudaEventRecord(stop, streams[0]));

  // Ordering: streams[1] waits for an event recorded after a 50 ms producer on streams[2].
  int *produced, *consumed;
  RT_CHECK(cudaMalloc(&produced, bytes));
  RT_CHECK(cudaMalloc(&consumed, bytes));
  RT_CHECK(cudaMemset(produced, 0, bytes));
  RT_CHECK(cudaDeviceSynchronize());
  cudaEvent_t ready;
  RT_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  slow_produce<<<128, 256, 0, streams[2]>>>(produced, 1000, n, 50ull * 1000 * 1000);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaEventRecord(ready, streams[2]));
  RT_CHECK(cudaStreamWaitEvent(streams[1], ready, 0));
  consume<<<128, 256, 0, streams[1]>>>(produced, consumed, n);
  RT_CHECK_LAUNCH();
  std::vector<int> order(n);
  RT_CHECK(cudaMemcpyAsync(order.data(), consumed, bytes, cudaMemcpyDeviceToHost, streams[1]));
  RT_CHECK(cudaStreamSynchronize(streams[1]));
  const bool ready_done = cudaEventQuery(ready) == cudaSuccess;  // the wait implies it

  RT_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  RT_CHECK(cudaEventElapsedTime(&ms, start, stop));
  RT_CHECK(cudaDeviceSynchronize());

  int wrong = 0;
  std::uint64_t checksum = 0;
  for (int s = 0; s < kStreams; ++s) {
    for (int i = 0; i < n; ++i) {
      int v = i ^ (s * 7919);
      for (int r = 0; r < 3; ++r) v = v * 3 + s + r;
      wrong += host[s][i] != v;
    }
    checksum = rt_checksum(host[s], bytes, checksum ? checksum : 1469598103934665603ull);
  }
  int misordered = 0;
  for (int i = 0; i < n; ++i) misordered += order[i] != 2 * (1000 + i);
  for (int s = 0; s < kStreams; ++s) {
    RT_CHECK(cudaStreamDestroy(streams[s]));
    RT_CHECK(cudaFreeHost(host[s]));
    RT_CHECK(cudaFree(dev[s]));
  }
  RT_CHECK(cudaFree(produced));
  RT_CHECK(cudaFree(consumed));
  const bool ok = wrong == 0 && misordered == 0 && ms > 0.0f && ready_done;
  return RT_REPORT(ok,
                   "streams=%d wrong=%d misordered=%d elapsed_positive=%d wait_done=%d "
                   "checksum=%016llx elapsed_ms=%.3f",
                   kStreams, wrong, misordered, ms > 0.0f ? 1 : 0, ready_done ? 1 : 0,
                   static_cast<unsigned long long>(checksum), ms);
}

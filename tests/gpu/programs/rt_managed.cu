// cudaMallocManaged touched by the CPU and the GPU in turn, and while a kernel runs: a ping-pong
// of increments through one managed buffer, a flag the GPU sets for a CPU thread that polls it
// during the kernel (concurrentManagedAccess), advice and prefetches read back with
// cudaMemRangeGetAttribute, and the managed pointer's attributes. The result fields must equal
// natively and under mpsshim (docs/host-memory.md: under the shim the pages stay in host memory).
static const char* const kProgram = "rt_managed";
#include <atomic>
#include <thread>

#include "rt_common.cuh"

__global__ void bump(int* p, int n, int round) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = p[i] * 3 + round;
}

// Sets *flag after a while, then waits for the CPU's answer in *answer.
__global__ void handshake(volatile int* flag, volatile int* answer) {
  rt_spin_ns(2000000);
  *flag = 1;
  __threadfence_system();
  for (long long spins = 0; *answer == 0 && spins < (1ll << 32); ++spins) {
  }
}

int main() {
  const int n = 1 << 20;
  const size_t bytes = sizeof(int) * n;
  int attr_managed = -1, attr_concurrent = -1;
  RT_CHECK(cudaDeviceGetAttribute(&attr_managed, cudaDevAttrManagedMemory, 0));
  RT_CHECK(cudaDeviceGetAttribute(&attr_concurrent, cudaDevAttrConcurrentManagedAccess, 0));
  int* data = nullptr;
  RT_CHECK(cudaMallocManaged(&data, bytes));
  // Ping-pong: the host and the device take turns on every element.
  for (int i = 0; i < n; ++i) data[i] = i - n / 2;
  for (int round = 1; round <= 8; ++round) {
    bump<<<256, 256>>>(data, n, round);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i += 7) data[i] ^= round;  // the host's turn
  }
  const std::uint64_t checksum = rt_checksum(data, bytes);

  // The CPU answers the GPU while the kernel runs.
  int* flags = nullptr;
  RT_CHECK(cudaMallocManaged(&flags, 2 * sizeof(int), cudaMemAttachGlobal));
  flags[0] = flags[1] = 0;
  handshake<<<1, 1>>>(flags, flags + 1);
  RT_CHECK_LAUNCH();
  bool seen = false;
  for (long long spins = 0; spins < (1ll << 34) && !seen; ++spins) {
    seen = reinterpret_cast<volatile int*>(flags)[0] == 1;
  }
  reinterpret_cast<volatile int*>(flags)[1] = 1;
  RT_CHECK(cudaDeviceSynchronize());

  // Advice and prefetches, read back.
  RT_CHECK(cudaMemAdvise(data, bytes, cudaMemAdviseSetReadMostly,
                         cudaMemLocation{cudaMemLocationTypeDevice, 0}));
  RT_CHECK(cudaMemAdvise(data, bytes / 2, cudaMemAdviseSetPreferredLocation,
                         cudaMemLocation{cudaMemLocationTypeHost, 0}));
  RT_CHECK(cudaMemPrefetchAsync(data, bytes, cudaMemLocation{cudaMemLocationTypeDevice, 0}, 0, 0));
  RT_CHECK(cudaDeviceSynchronize());
  int read_mostly = -7, preferred_half = -7, preferred_all = -7, last_prefetch = -7;
  RT_CHECK(cudaMemRangeGetAttribute(&read_mostly, 4, cudaMemRangeAttributeReadMostly, data, bytes));
  RT_CHECK(cudaMemRangeGetAttribute(&preferred_half, 4, cudaMemRangeAttributePreferredLocation,
                                    data, bytes / 2));
  RT_CHECK(cudaMemRangeGetAttribute(&preferred_all, 4, cudaMemRangeAttributePreferredLocation, data,
                                    bytes));
  RT_CHECK(cudaMemRangeGetAttribute(&last_prefetch, 4, cudaMemRangeAttributeLastPrefetchLocation,
                                    data, bytes));
  const std::uint64_t after_prefetch = rt_checksum(data, bytes);

  cudaPointerAttributes attributes{};
  RT_CHECK(cudaPointerGetAttributes(&attributes, data + 5));
  const bool pointer_ok = attributes.type == cudaMemoryTypeManaged &&
                          attributes.devicePointer == data + 5 &&
                          attributes.hostPointer == data + 5;
  RT_CHECK(cudaFree(flags));
  RT_CHECK(cudaFree(data));
  const bool ok = attr_managed == 1 && seen && pointer_ok && checksum == after_prefetch;
  return RT_REPORT(ok,
                   "attr_managed=%d attr_concurrent=%d handshake=%d pointer=%d read_mostly=%d "
                   "preferred_half=%d preferred_all=%d last_prefetch=%d checksum=%016llx",
                   attr_managed, attr_concurrent, seen ? 1 : 0, pointer_ok ? 1 : 0, read_mostly,
                   preferred_half, preferred_all, last_prefetch,
                   static_cast<unsigned long long>(checksum));
}

// cudaMallocManaged. Natively it works; under mpsshim it is refused with cudaErrorNotSupported
// and the device reports managedMemory = 0 (docs/host-memory.md). PASS in both cases, but only
// when the behaviour is self-consistent: the attribute agrees with what cudaMallocManaged did,
// managed results are right when it works, and the runtime still works after a refusal.
static const char* const kProgram = "rt_managed";
#include <vector>

#include "rt_common.cuh"

__global__ void triple(int* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = 3 * p[i] + 1;
}

int main() {
  const int n = 1 << 20;
  const size_t bytes = sizeof(int) * n;
  int attr_managed = -1, attr_concurrent = -1;
  RT_CHECK(cudaDeviceGetAttribute(&attr_managed, cudaDevAttrManagedMemory, 0));
  RT_CHECK(cudaDeviceGetAttribute(&attr_concurrent, cudaDevAttrConcurrentManagedAccess, 0));
  int* managed = nullptr;
  const cudaError_t alloc = cudaMallocManaged(&managed, bytes);
  std::uint64_t checksum = 0;
  int wrong = 0;
  const char* mode = "inconsistent";
  bool consistent = false;
  if (alloc == cudaSuccess) {
    mode = "supported";
    for (int i = 0; i < n; ++i) managed[i] = i - n / 2;  // host writes managed memory
    triple<<<256, 256>>>(managed, n);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; ++i) wrong += managed[i] != 3 * (i - n / 2) + 1;
    checksum = rt_checksum(managed, bytes);
    RT_CHECK(cudaFree(managed));
    consistent = attr_managed == 1 && wrong == 0;
  } else if (alloc == cudaErrorNotSupported) {
    mode = "not_supported";
    (void)cudaGetLastError();  // clear the (non-sticky) error
    // The runtime must go on working with explicit memory.
    std::vector<int> host(n);
    for (int i = 0; i < n; ++i) host[i] = i - n / 2;
    int* dev;
    RT_CHECK(cudaMalloc(&dev, bytes));
    RT_CHECK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
    triple<<<256, 256>>>(dev, n);
    RT_CHECK_LAUNCH();
    RT_CHECK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
    RT_CHECK(cudaFree(dev));
    for (int i = 0; i < n; ++i) wrong += host[i] != 3 * (i - n / 2) + 1;
    checksum = rt_checksum(host.data(), bytes);
    consistent = attr_managed == 0 && attr_concurrent == 0 && managed == nullptr && wrong == 0;
  } else {
    std::printf("%s: cudaMallocManaged returned %s (%d)\n", kProgram, cudaGetErrorName(alloc),
                static_cast<int>(alloc));
  }
  return RT_REPORT(consistent,
                   "managed=%s attr_managed=%d attr_concurrent=%d wrong=%d checksum=%016llx", mode,
                   attr_managed, attr_concurrent, wrong, static_cast<unsigned long long>(checksum));
}

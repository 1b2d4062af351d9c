// Pinned host memory in every form the runtime offers: cudaMallocHost, cudaHostAlloc with
// Default / Portable / Mapped / WriteCombined (copies through each), a kernel writing through
// the device pointer of a Mapped allocation (cudaHostGetDevicePointer), and cudaHostRegister of
// malloc'd memory used for copies.
static const char* const kProgram = "rt_pinned_mapped";
#include <cstring>
#include <vector>

#include "rt_common.cuh"

__global__ void square_plus(const int* in, int* out, int add, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i] * in[i] + add;
}

// Writes straight into host memory through its mapped device pointer.
__global__ void write_mapped(int* mapped, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    mapped[i] = 7 * i + 1;
}

int n_global = 1 << 20;

// Round trip host -> device -> kernel -> host through `host`; returns the wrong count.
int round_trip(int* host, int* dev_in, int* dev_out, int add, cudaStream_t stream,
               std::uint64_t& checksum) {
  const int n = n_global;
  const size_t bytes = sizeof(int) * n;
  for (int i = 0; i < n; ++i) host[i] = (i % 4096) - 2048 + add;
  RT_CHECK(cudaMemcpyAsync(dev_in, host, bytes, cudaMemcpyHostToDevice, stream));
  square_plus<<<256, 256, 0, stream>>>(dev_in, dev_out, add, n);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpyAsync(host, dev_out, bytes, cudaMemcpyDeviceToHost, stream));
  RT_CHECK(cudaStreamSynchronize(stream));
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    const int v = (i % 4096) - 2048 + add;
    wrong += host[i] != v * v + add;
  }
  checksum = rt_checksum(host, bytes, checksum);
  return wrong;
}

int main() {
  const int n = n_global;
  const size_t bytes = sizeof(int) * n;
  int can_map = 0;
  RT_CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
  int *dev_in, *dev_out;
  RT_CHECK(cudaMalloc(&dev_in, bytes));
  RT_CHECK(cudaMalloc(&dev_out, bytes));
  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::uint64_t checksum = 1469598103934665603ull;
  int wrong = 0;

  int* malloc_host;
  RT_CHECK(cudaMallocHost(&malloc_host, bytes));
  wrong += round_trip(malloc_host, dev_in, dev_out, 1, stream, checksum);
  RT_CHECK(cudaFreeHost(malloc_host));

  const unsigned kFlags[] = {cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocMapped,
                             cudaHostAllocWriteCombined};
  int flags_wrong = 0;
  for (int f = 0; f < 4; ++f) {
    int* host;
    RT_CHECK(cudaHostAlloc(&host, bytes, kFlags[f]));
    unsigned got = 0;
    RT_CHECK(cudaHostGetFlags(&got, host));
    // The runtime may add flags (Mapped under unified addressing), never drop ours.
    flags_wrong += (got & kFlags[f]) != kFlags[f];
    wrong += round_trip(host, dev_in, dev_out, 10 + f, stream, checksum);
    RT_CHECK(cudaFreeHost(host));
  }

  // A kernel writing through the mapped device pointer.
  int* mapped_host;
  RT_CHECK(cudaHostAlloc(&mapped_host, bytes, cudaHostAllocMapped));
  std::memset(mapped_host, 0, bytes);
  int* mapped_dev = nullptr;
  RT_CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped_host, 0));
  write_mapped<<<256, 256, 0, stream>>>(mapped_dev, n);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaStreamSynchronize(stream));
  int mapped_wrong = 0;
  for (int i = 0; i < n; ++i) mapped_wrong += mapped_host[i] != 7 * i + 1;
  RT_CHECK(cudaFreeHost(mapped_host));

  // cudaHostRegister of malloc'd memory, then copies from and to it.
  std::vector<int> backing(n + 1024);
  int* registered = backing.data() + 16;  // not page-aligned on purpose
  RT_CHECK(cudaHostRegister(registered, bytes, cudaHostRegisterDefault));
  wrong += round_trip(registered, dev_in, dev_out, 99, stream, checksum);
  RT_CHECK(cudaHostUnregister(registered));
  const bool unregister_twice_fails = cudaHostUnregister(registered) != cudaSuccess;
  (void)cudaGetLastError();

  RT_CHECK(cudaStreamDestroy(stream));
  RT_CHECK(cudaFree(dev_in));
  RT_CHECK(cudaFree(dev_out));
  const bool ok =
      wrong == 0 && flags_wrong == 0 && mapped_wrong == 0 && can_map == 1 && unregister_twice_fails;
  return RT_REPORT(ok,
                   "n=%d wrong=%d flags_wrong=%d mapped_wrong=%d can_map=%d "
                   "unregister_twice_fails=%d checksum=%016llx",
                   n, wrong, flags_wrong, mapped_wrong, can_map, unregister_twice_fails ? 1 : 0,
                   static_cast<unsigned long long>(checksum));
}

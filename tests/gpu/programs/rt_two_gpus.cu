// Memory on two GPUs held at once by one process: every allocation (small and large cudaMalloc,
// cudaMallocPitch, small and large cudaMallocAsync) has its own device addresses,
// cudaPointerGetAttributes names its GPU, and each GPU's kernel results read back intact. Under the
// shim each GPU is a different server process, whose driver would hand out the same addresses as
// the other's (docs/architecture.md, one device address space). Needs two GPUs (gpu_suite.sh runs
// it only then).
constexpr const char* kProgram = "rt_two_gpus";
#include <algorithm>
#include <vector>

#include "rt_common.cuh"

__global__ void fill(unsigned* p, std::size_t n, unsigned salt) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = static_cast<unsigned>(i) * 2654435761u + salt;
  }
}

int main() {
  int count = 0;
  RT_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("%s: gpus=%d FAIL (needs two)\n", kProgram, count);
    return 1;
  }
  struct Range {
    int device;
    unsigned* base;
    std::size_t bytes;
    bool stream_ordered = false;
  };
  std::vector<Range> ranges;
  const std::size_t sizes[] = {std::size_t{64} << 10, std::size_t{6} << 20};
  for (int d = 0; d < 2; ++d) {
    RT_CHECK(cudaSetDevice(d));
    for (std::size_t bytes : sizes) {
      void* p = nullptr;
      RT_CHECK(cudaMalloc(&p, bytes));
      ranges.push_back({d, static_cast<unsigned*>(p), bytes});
    }
    void* pitched = nullptr;
    std::size_t pitch = 0;
    RT_CHECK(cudaMallocPitch(&pitched, &pitch, 1000, 64));
    ranges.push_back({d, static_cast<unsigned*>(pitched), pitch * 64});
    // Stream-ordered: the driver's pools would place them alike in two processes.
    for (std::size_t bytes : sizes) {
      void* p = nullptr;
      RT_CHECK(cudaMallocAsync(&p, bytes, 0));
      ranges.push_back({d, static_cast<unsigned*>(p), bytes, true});
    }
    RT_CHECK(cudaDeviceSynchronize());
  }
  int overlaps = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      const auto a = reinterpret_cast<std::uintptr_t>(ranges[i].base);
      const auto b = reinterpret_cast<std::uintptr_t>(ranges[j].base);
      if (a < b + ranges[j].bytes && b < a + ranges[i].bytes) ++overlaps;
    }
  }
  int wrong_device = 0;
  std::uint64_t sum = 0;
  for (const Range& r : ranges) {
    RT_CHECK(cudaSetDevice(r.device));
    cudaPointerAttributes attributes{};
    RT_CHECK(cudaPointerGetAttributes(&attributes, r.base));
    if (attributes.device != r.device || attributes.type != cudaMemoryTypeDevice) ++wrong_device;
    const std::size_t n = r.bytes / sizeof(unsigned);
    fill<<<64, 256>>>(r.base, n, 0x1000u * static_cast<unsigned>(r.device + 1));
    RT_CHECK_LAUNCH();
  }
  for (const Range& r : ranges) {
    RT_CHECK(cudaSetDevice(r.device));
    std::vector<unsigned> host(r.bytes / sizeof(unsigned));
    RT_CHECK(cudaMemcpy(host.data(), r.base, r.bytes, cudaMemcpyDeviceToHost));
    sum = rt_checksum(host.data(), r.bytes, sum ? sum : 1469598103934665603ull);
    if (r.stream_ordered) {
      RT_CHECK(cudaFreeAsync(r.base, 0));
      RT_CHECK(cudaDeviceSynchronize());
    } else {
      RT_CHECK(cudaFree(r.base));
    }
  }
  const bool ok = overlaps == 0 && wrong_device == 0;
  std::printf("%s: allocations=%zu overlaps=%d wrong_device=%d checksum=%016llx %s\n", kProgram,
              ranges.size(), overlaps, wrong_device, static_cast<unsigned long long>(sum),
              ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

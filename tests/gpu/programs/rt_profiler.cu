// cudaProfilerStart / cudaProfilerStop around a kernel, natively and under the shim: with no
// profiler attached both succeed and the kernel's result is unchanged (under the shim the client's
// GPU work runs in mpsshim-server, which is where a profiler attaches: docs/cuda-runtime.md).
// Every result is a field, so the GPU suite compares the shim's run with the driver's. Exit 77
// without a GPU.
static const char* const kProgram = "rt_profiler";
#include <cuda_profiler_api.h>

#include <vector>

#include "rt_common.cuh"

__global__ void square(int* data, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = data[i] * data[i];
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 77;
  RT_CHECK(cudaSetDevice(0));
  constexpr int kN = 1 << 16;
  std::vector<int> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = i % 1000;
  int* data = nullptr;
  RT_CHECK(cudaMalloc(&data, sizeof(int) * kN));
  RT_CHECK(cudaMemcpy(data, host.data(), sizeof(int) * kN, cudaMemcpyHostToDevice));
  const int started = static_cast<int>(cudaProfilerStart());
  square<<<64, 256>>>(data, kN);
  RT_CHECK_LAUNCH();
  const int stopped = static_cast<int>(cudaProfilerStop());
  std::vector<int> got(kN);
  RT_CHECK(cudaMemcpy(got.data(), data, sizeof(int) * kN, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += got[i] != (i % 1000) * (i % 1000);
  const bool ok = started == 0 && stopped == 0 && wrong == 0;
  return RT_REPORT(ok, "start=%d stop=%d wrong=%d checksum=%016llx", started, stopped, wrong,
                   static_cast<unsigned long long>(rt_checksum(got.data(), got.size() * 4)));
}

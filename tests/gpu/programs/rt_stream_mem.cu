// Stream memory operations through the driver entry points a program gets from
// cudaGetDriverEntryPointByVersion (as NCCL gets them): a stream waits for a flag that another
// stream's kernel sets, 32- and 64-bit, and a write from a stream lands in pinned host memory.
constexpr const char* kProgram = "rt_stream_mem";
#include <cuda.h>

#include "rt_common.cuh"

__global__ void set_after(unsigned long long* flag, unsigned long long value,
                          unsigned long long ns) {
  rt_spin_ns(ns);
  *reinterpret_cast<volatile unsigned long long*>(flag) = value;
  __threadfence_system();
}

__global__ void copy_flag(const unsigned long long* flag, unsigned long long* out) {
  *out = *reinterpret_cast<const volatile unsigned long long*>(flag);
}

template <typename Fn>
Fn entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  RT_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::printf("%s: %s not found FAIL\n", kProgram, name);
    std::exit(1);
  }
  return reinterpret_cast<Fn>(fn);
}

int main() {
  using Wait32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  using Wait64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  using Write64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  auto wait32 = entry_point<Wait32>("cuStreamWaitValue32");
  auto wait64 = entry_point<Wait64>("cuStreamWaitValue64");
  auto write64 = entry_point<Write64>("cuStreamWriteValue64");
  cudaStream_t waiter{}, setter{};
  RT_CHECK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&setter, cudaStreamNonBlocking));
  unsigned long long* flags = nullptr;
  RT_CHECK(cudaMalloc(&flags, 4 * sizeof(unsigned long long)));
  RT_CHECK(cudaMemset(flags, 0, 4 * sizeof(unsigned long long)));
  RT_CHECK(cudaDeviceSynchronize());
  const auto at = [&](int i) { return reinterpret_cast<CUdeviceptr>(flags + i); };
  // Both kernels run once first: loading a kernel lazily at its first launch may wait for the
  // context's other work, which would then wait on the waiter stream forever (CUDA's lazy
  // loading documents this deadlock).
  set_after<<<1, 1, 0, setter>>>(flags + 3, 0, 0);
  copy_flag<<<1, 1, 0, setter>>>(flags + 3, flags + 3);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaDeviceSynchronize());

  // The waiter waits for flag 0 >= 1 (32-bit) and flag 1 == 2^40 + 5 (64-bit), then copies
  // flag 1 to flag 2; the setter's kernels set them after 20 ms of GPU time each.
  int errors = 0;
  errors += wait32(waiter, at(0), 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS;
  errors += wait64(waiter, at(1), (1ull << 40) + 5, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS;
  copy_flag<<<1, 1, 0, waiter>>>(flags + 1, flags + 2);
  RT_CHECK_LAUNCH();
  const cudaError_t before = cudaStreamQuery(waiter);
  set_after<<<1, 1, 0, setter>>>(flags + 0, 1, 20'000'000);
  set_after<<<1, 1, 0, setter>>>(flags + 1, (1ull << 40) + 5, 20'000'000);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaStreamSynchronize(waiter));
  unsigned long long copied = 0;
  RT_CHECK(cudaMemcpy(&copied, flags + 2, sizeof copied, cudaMemcpyDeviceToHost));

  unsigned long long* host = nullptr;
  RT_CHECK(cudaHostAlloc(&host, 64, cudaHostAllocMapped));
  host[0] = 0;
  unsigned long long* host_device = nullptr;
  RT_CHECK(cudaHostGetDevicePointer(&host_device, host, 0));
  errors += write64(setter, reinterpret_cast<CUdeviceptr>(host_device), 0xfeedface12ull, 0) !=
            CUDA_SUCCESS;
  RT_CHECK(cudaStreamSynchronize(setter));
  const bool ok = errors == 0 && before == cudaErrorNotReady && copied == (1ull << 40) + 5 &&
                  host[0] == 0xfeedface12ull;
  std::printf("%s: errors=%d waited=%d copied=%llx host=%llx %s\n", kProgram, errors,
              before == cudaErrorNotReady, copied, host[0], ok ? "PASS" : "FAIL");
  RT_CHECK(cudaFreeHost(host));
  RT_CHECK(cudaFree(flags));
  return ok ? 0 : 1;
}

// Managed memory through the whole path (docs/host-memory.md): run under
// LD_PRELOAD=libmpsshim.so against mpsshimd and the test driver by tests/e2e/capture_test.cpp.
// The errors and attribute answers expected here are the H200's (driver 580), measured with the
// same calls natively. Prints one PASS or FAIL line.
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e managed module\n.version 8.0\n.target sm_90\n";
constexpr int kCpu = -1;      // CU_DEVICE_CPU
constexpr int kInvalid = -2;  // CU_DEVICE_INVALID

int range_int(CUmem_range_attribute attribute, CUdeviceptr p, size_t bytes) {
  int value = -7;
  CHECK(cuMemRangeGetAttribute(&value, sizeof value, attribute, p, bytes));
  return value;
}

int managed(int n) {
  CUdevice device{};
  CUcontext ctx{};
  CUmodule module{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuModuleLoadData(&module, kModuleImage));
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, module, "increment_i32"));

  // The device advertises managed memory and concurrent access, as natively.
  for (CUdevice_attribute a :
       {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS}) {
    int value = 0;
    CHECK(cuDeviceGetAttribute(&value, a, device));
    if (value != 1) return fail("a managed-memory attribute reads 0");
  }
  // ... but not what needs the driver in this process.
  for (CUdevice_attribute a : {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
                               CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
                               CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM}) {
    int value = -1;
    CHECK(cuDeviceGetAttribute(&value, a, device));
    if (value != 0) return fail("a pageable/direct-access attribute does not read 0");
  }

  // The driver's argument errors.
  CUdeviceptr m = 0;
  EXPECT(cuMemAllocManaged(&m, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemAllocManaged(&m, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemAllocManaged(&m, 4096, 7), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemAllocManaged(nullptr, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);

  // The host writes, a kernel increments through the same pointer, the host reads: no copies.
  const size_t bytes = sizeof(int) * static_cast<size_t>(n);
  CHECK(cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL));
  int* host = reinterpret_cast<int*>(m);
  for (int i = 0; i < n; ++i) host[i] = 5 * i - 3;
  void* args[] = {&m, &n};
  CHECK(cuLaunchKernel(increment, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuCtxSynchronize());
  for (int i = 0; i < n; ++i) {
    if (host[i] != 5 * i - 3 + 1) return fail("the host does not see the kernel's writes");
  }
  // Copies and memsets take it on either side, like device memory.
  CUdeviceptr dev{};
  CHECK(cuMemAlloc(&dev, bytes));
  CHECK(cuMemcpyDtoD(dev, m, bytes));
  CHECK(cuMemsetD32(m, 0, static_cast<size_t>(n)));
  CHECK(cuCtxSynchronize());
  if (host[n - 1] != 0) return fail("a memset of managed memory did not reach the host");
  CHECK(cuMemcpy(m, dev, bytes));
  if (host[n / 2] != 5 * (n / 2) - 3 + 1) return fail("cuMemcpy into managed memory");
  std::vector<int> back(static_cast<size_t>(n));
  CHECK(cuMemcpyDtoH(back.data(), m, bytes));
  if (std::memcmp(back.data(), host, bytes) != 0) return fail("cuMemcpyDtoH of managed memory");

  // A thread of the host touches it while a kernel is queued behind work on another stream: both
  // processors reach every page at any time (concurrentManagedAccess).
  CUdeviceptr flag = 0;
  CHECK(cuMemAllocManaged(&flag, 1000, CU_MEM_ATTACH_HOST));
  std::thread writer([flag] { *reinterpret_cast<volatile int*>(flag) = 41; });
  writer.join();
  int one = 1;
  void* flag_args[] = {&flag, &one};
  CHECK(cuLaunchKernel(increment, 1, 1, 1, 32, 1, 1, 0, nullptr, flag_args, nullptr));
  CHECK(cuCtxSynchronize());
  if (*reinterpret_cast<volatile int*>(flag) != 42) return fail("the flag's round trip");

  // Pointer attributes, as the H200 answers them.
  unsigned memory_type = 0;
  int is_managed = 0, mapped = 0;
  void* host_pointer = nullptr;
  CUdeviceptr device_pointer = 0, base = 0;
  size_t range_bytes = 0;
  CHECK(cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m + 8));
  CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 8));
  CHECK(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, m));
  CHECK(cuPointerGetAttribute(&host_pointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, m));
  CHECK(cuPointerGetAttribute(&device_pointer, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, m));
  CHECK(cuPointerGetAttribute(&range_bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, m));
  if (memory_type != CU_MEMORYTYPE_DEVICE || is_managed != 1 || mapped != 1 ||
      host_pointer != reinterpret_cast<void*>(m) || device_pointer != m || range_bytes != bytes) {
    return fail("managed memory's pointer attributes");
  }
  CHECK(cuMemGetAddressRange(&base, &range_bytes, m + 100));
  if (base != m || range_bytes != bytes) return fail("cuMemGetAddressRange of managed memory");
  CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dev));
  if (is_managed != 0) return fail("device memory reads as managed");
  CUdeviceptr mapped_pointer = 0;
  EXPECT(cuMemHostGetDevicePointer(&mapped_pointer, host, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemFreeHost(host), CUDA_ERROR_INVALID_VALUE);

  // Advice and prefetches, read back page by page.
  const size_t whole = 4 * 4096;
  CUdeviceptr a = 0;
  CHECK(cuMemAllocManaged(&a, whole, CU_MEM_ATTACH_GLOBAL));
  if (range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, a, whole) != 0 ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, a, whole) != kInvalid ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, a, whole) != kInvalid) {
    return fail("the range attributes before any advice");
  }
  const CUmemLocation gpu{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  const CUmemLocation cpu{CU_MEM_LOCATION_TYPE_HOST, 0};
  CHECK(cuMemAdvise(a, whole, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu));
  CHECK(cuMemAdvise(a, whole, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, gpu));
  CHECK(cuMemAdvise(a, whole, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu));
  CHECK(cuMemAdvise(a, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, cpu));
  CHECK(cuMemPrefetchAsync(a, whole, gpu, 0, nullptr));
  if (range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, a, whole) != 1 ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, a, whole) != kInvalid ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, a, 4096) != kCpu ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, a + 2 * 4096, 4096) != 0 ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, a + 4096, 3 * 4096) !=
          CU_MEM_LOCATION_TYPE_DEVICE ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, a, whole) != 0) {
    return fail("the range attributes after advice and a prefetch");
  }
  int accessed_by[4] = {-7, -7, -7, -7};
  CHECK(cuMemRangeGetAttribute(accessed_by, sizeof accessed_by, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY,
                               a, whole));
  if (accessed_by[0] != 0 || accessed_by[1] != kInvalid || accessed_by[3] != kInvalid) {
    return fail("ACCESSED_BY");
  }
  // Unset on the middle pages: the whole range no longer has it, its ends still do.
  CHECK(cuMemAdvise(a + 4096, 2 * 4096, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu));
  if (range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, a, whole) != 0 ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, a + 3 * 4096, 4096) != 1) {
    return fail("READ_MOSTLY after an unset of the middle pages");
  }
  // The batch forms.
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr ranges[2] = {a, a + 2 * 4096};
  size_t sizes[2] = {4096, 2 * 4096};
  CUmemLocation where[2] = {cpu, gpu};
  size_t first_of[2] = {0, 1};
  CHECK(cuMemPrefetchBatchAsync(ranges, sizes, 2, where, first_of, 2, 0, stream));
  if (range_int(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, a, 4096) != kCpu ||
      range_int(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, a + 3 * 4096, 4096) != 0) {
    return fail("cuMemPrefetchBatchAsync's locations");
  }
  EXPECT(cuMemPrefetchBatchAsync(ranges, sizes, 2, where, first_of, 2, 0, nullptr),
         CUDA_ERROR_INVALID_VALUE);  // not on the legacy stream
  CHECK(cuMemDiscardBatchAsync(ranges, sizes, 2, 0, stream));

  // What the driver refuses: ranges past the allocation, memory that is not managed.
  EXPECT(cuMemRangeGetAttribute(accessed_by, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, a,
                                whole + 4096),
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemRangeGetAttribute(accessed_by, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, dev,
                                4096),
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemAdvise(dev, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemPrefetchAsync(dev, 4096, gpu, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamAttachMemAsync(stream, m, 0, CU_MEM_ATTACH_GLOBAL));
  EXPECT(cuStreamAttachMemAsync(stream, m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuStreamAttachMemAsync(stream, dev, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAdvise(a + 1, 100, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu));  // pages, as natively

  // Freed with cuMemFree, once.
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(m));
  EXPECT(cuMemFree(m), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemRangeGetAttribute(accessed_by, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 4),
         CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(flag));
  CHECK(cuMemFree(dev));
  std::printf("PASS managed n=%d\n", n);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "managed") return managed(argc > 2 ? std::atoi(argv[2]) : 1000);
  std::printf("FAIL unknown mode %s\n", mode.c_str());
  return 2;
}

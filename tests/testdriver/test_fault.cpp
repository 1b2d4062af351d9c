// A device fault poisons the whole process, as measured with the real driver. Each case faults a
// fresh process of its own.
#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

TEST_CASE("isolated: trigger_fault", "[.isolated]") {
  Session s;
  const GreenStream other = make_green_stream(0, 8, 1, 0);
  const CUdeviceptr allocated = s.alloc(16);
  CUdeviceptr p = 0;  // NULL, as the fault example passes
  void* params[] = {&p};

  CHECK_CU(s.sut.cuLaunchKernel(s.function("trigger_fault"), 1, 1, 1, 1, 1, 1, 0, s.stream, params,
                                nullptr),
           CUDA_SUCCESS);  // asynchronous: the launch itself succeeds
  CHECK_CU(s.sut.cuStreamSynchronize(s.stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK_CU(s.sut.cuStreamSynchronize(other.stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  CUdeviceptr q = 0;
  CHECK_CU(s.sut.cuMemAlloc_v2(&q, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK_CU(s.sut.cuMemFree_v2(allocated), CUDA_ERROR_ILLEGAL_ADDRESS);
  int count = 0;
  CHECK_CU(s.sut.cuDeviceGetCount(&count), CUDA_ERROR_ILLEGAL_ADDRESS);
  const char* name = nullptr;
  CHECK_CU(s.sut.cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &name), CUDA_SUCCESS);
}

TEST_CASE("isolated: out-of-bounds kernel", "[.isolated]") {
  Session s;
  CUdeviceptr p = s.alloc(64 * sizeof(int));
  int n = 65;  // one past the allocation
  void* params[] = {&p, &n};
  CHECK_CU(s.sut.cuLaunchKernel(s.function("increment_i32"), 1, 1, 1, 128, 1, 1, 0, s.stream,
                                params, nullptr),
           CUDA_SUCCESS);
  CHECK_CU(s.sut.cuStreamSynchronize(s.stream), CUDA_ERROR_ILLEGAL_ADDRESS);
}

TEST_CASE("isolated: misaligned kernel argument", "[.isolated]") {
  Session s;
  CUdeviceptr p = s.alloc(64) + 1;
  unsigned value = 1;
  int n = 4;
  void* params[] = {&p, &value, &n};
  CHECK_CU(
      s.sut.cuLaunchKernel(s.function("fill_u32"), 1, 1, 1, 32, 1, 1, 0, s.stream, params, nullptr),
      CUDA_SUCCESS);
  CHECK_CU(s.sut.cuStreamSynchronize(s.stream), CUDA_ERROR_MISALIGNED_ADDRESS);
}

TEST_CASE("isolated: work queued on freed memory", "[.isolated]") {
  Session s;
  const CUdeviceptr p = s.alloc(4096);
  std::vector<char> host(4096);
  int sleep_us = 100000;
  void* params[] = {&sleep_us};
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("sleep_kernel"), 1, 1, 1, 1, 1, 1, 0, s.stream, params,
                                  nullptr));
  REQUIRE_CU(s.sut.cuMemHostRegister_v2(host.data(), host.size(), 0));
  REQUIRE_CU(s.sut.cuMemcpyHtoDAsync_v2(p, host.data(), host.size(), s.stream));
  // Unregistering does not wait for the queued copy, which then reads unpinned memory.
  REQUIRE_CU(s.sut.cuMemHostUnregister(host.data()));
  CHECK_CU(s.sut.cuStreamSynchronize(s.stream), CUDA_ERROR_ILLEGAL_ADDRESS);
}

TEST_CASE("a device fault is sticky and process-wide", "[fault]") {
  CHECK(run_isolated("isolated: trigger_fault") == 0);
}

TEST_CASE("kernels fault on memory they may not touch", "[fault]") {
  CHECK(run_isolated("isolated: out-of-bounds kernel") == 0);
  CHECK(run_isolated("isolated: misaligned kernel argument") == 0);
  CHECK(run_isolated("isolated: work queued on freed memory") == 0);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

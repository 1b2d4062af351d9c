// Device memory, copies, memsets and registered host memory.
#include <csignal>
#include <cstdint>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr std::size_t kAllocationAlignment = 256;
constexpr std::size_t kPitchAlignment = 512;

TEST_CASE("bytes make a round trip through device memory", "[memory]") {
  Session s;
  std::vector<std::uint8_t> pattern(100000);
  std::iota(pattern.begin(), pattern.end(), std::uint8_t{7});
  const CUdeviceptr a = s.alloc(pattern.size());
  const CUdeviceptr b = s.alloc(pattern.size());

  s.upload(a, pattern);
  REQUIRE_CU(s.sut.cuMemcpyDtoDAsync_v2(b, a, pattern.size(), s.stream));
  const auto back = s.download<std::uint8_t>(b, pattern.size());

  CHECK(back == pattern);
  CHECK(a % kAllocationAlignment == 0);
  CHECK(b % kAllocationAlignment == 0);
}

TEST_CASE("the NULL stream works in the current context", "[memory]") {
  Session s;
  const std::vector<int> values{1, 2, 3};
  const CUdeviceptr p = s.alloc(sizeof(int) * values.size());
  REQUIRE_CU(s.sut.cuMemcpyHtoDAsync_v2(p, values.data(), sizeof(int) * values.size(), nullptr));
  std::vector<int> back(values.size());
  REQUIRE_CU(
      s.sut.cuMemcpyDtoHAsync_v2(back.data(), p, sizeof(int) * back.size(), CU_STREAM_LEGACY));
  CHECK(back == values);
}

TEST_CASE("allocations are accounted and limited", "[memory]") {
  Session s;
  std::size_t free_before = 0, total = 0, free_after = 0;
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_before, &total));
  CHECK(total == 1024u << 20);

  const CUdeviceptr p = s.alloc(1000);
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_after, &total));
  CHECK(free_before - free_after == 1024);  // 1000 rounded up to the allocation granule

  CUdeviceptr too_big = 0;
  CHECK_CU(s.sut.cuMemAlloc_v2(&too_big, total), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_CU(s.sut.cuMemAlloc_v2(&too_big, 0), CUDA_ERROR_INVALID_VALUE);

  REQUIRE_CU(s.sut.cuMemFree_v2(p));
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_after, &total));
  CHECK(free_after == free_before);
  CHECK_CU(s.sut.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
  const CUdeviceptr q = s.alloc(4096);
  CHECK_CU(s.sut.cuMemFree_v2(q + 64), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemFree_v2(0), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("freed memory can be allocated again", "[memory]") {
  Session s;
  std::size_t free_bytes = 0, total = 0;
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_bytes, &total));
  for (int round = 0; round < 3; ++round) {
    const std::size_t half = free_bytes / 2;
    const std::size_t touched = 64u << 20;
    const CUdeviceptr big = s.alloc(half);
    REQUIRE_CU(s.sut.cuMemsetD8Async(big + half - touched, 0xab, touched, s.stream));
    s.sync();
    REQUIRE_CU(s.sut.cuMemFree_v2(big));
  }
}

TEST_CASE("pitched allocations round the pitch up to 512", "[memory]") {
  Session s;
  CUdeviceptr p = 0;
  std::size_t pitch = 0;
  REQUIRE_CU(s.sut.cuMemAllocPitch_v2(&p, &pitch, 100, 3, 4));
  CHECK(pitch == kPitchAlignment);
  CHECK_CU(s.sut.cuMemAllocPitch_v2(&p, &pitch, 100, 3, 3), CUDA_ERROR_INVALID_VALUE);

  REQUIRE_CU(s.sut.cuMemsetD2D32Async(p, pitch, 0x01020304u, 25, 3, s.stream));
  const auto rows = s.download<std::uint32_t>(p, pitch * 3 / 4);
  CHECK(rows[0] == 0x01020304u);
  CHECK(rows[24] == 0x01020304u);
  CHECK(rows[kPitchAlignment / 4 * 2 + 24] == 0x01020304u);
}

TEST_CASE("memsets fill elements of their width", "[memory]") {
  Session s;
  const CUdeviceptr p = s.alloc(64);
  REQUIRE_CU(s.sut.cuMemsetD8Async(p, 0x11, 64, s.stream));
  REQUIRE_CU(s.sut.cuMemsetD16Async(p, 0x2222, 8, s.stream));
  REQUIRE_CU(s.sut.cuMemsetD32Async(p + 16, 0x33333333u, 2, s.stream));
  REQUIRE_CU(s.sut.cuMemsetD2D8Async(p + 32, 8, 0x44, 2, 2, s.stream));
  REQUIRE_CU(s.sut.cuMemsetD2D16Async(p + 48, 4, 0x5555, 1, 2, s.stream));
  const auto bytes = s.download<std::uint8_t>(p, 64);
  CHECK(bytes[0] == 0x22);
  CHECK(bytes[15] == 0x22);
  CHECK(bytes[16] == 0x33);
  CHECK(bytes[24] == 0x11);
  CHECK(bytes[32] == 0x44);
  CHECK(bytes[34] == 0x11);
  CHECK(bytes[40] == 0x44);
  CHECK(bytes[48] == 0x55);
  CHECK(bytes[50] == 0x11);
  CHECK(bytes[52] == 0x55);
  CHECK_CU(s.sut.cuMemsetD32Async(p + 2, 0, 1, s.stream), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemsetD2D8Async(p, 4, 0, 8, 2, s.stream), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("copies must stay inside one allocation", "[memory]") {
  Session s;
  const CUdeviceptr p = s.alloc(4096);
  std::vector<char> host(8192);
  CHECK_CU(s.sut.cuMemcpyHtoDAsync_v2(p + 4096 - 16, host.data(), 17, s.stream),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemcpyDtoHAsync_v2(host.data(), p + 1, 4096, s.stream),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemsetD8Async(p, 0, 4097, s.stream), CUDA_ERROR_INVALID_VALUE);
  const CUdeviceptr unrelated = 0x1000;
  CHECK_CU(s.sut.cuMemcpyDtoDAsync_v2(p, unrelated, 16, s.stream), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemcpyHtoDAsync_v2(p, host.data(), 4096, s.stream), CUDA_SUCCESS);
}

TEST_CASE("device pointers are not host memory", "[memory]") {
  Session s;
  const CUdeviceptr p = s.alloc(4096);
  const int status = run_forked([p] {
    std::signal(SIGSEGV, SIG_DFL);  // not Catch's handler: the parent judges how the child ended
    *reinterpret_cast<volatile char*>(p) = 1;
    return 0;
  });
  CHECK(status == 128 + SIGSEGV);
}

TEST_CASE("registered host memory is device-accessible at its own address", "[memory]") {
  Session s;
  const int live_before = driver().live_objects();
  std::vector<int> host(1024, 0);
  const std::size_t bytes = host.size() * sizeof(int);

  REQUIRE_CU(s.sut.cuMemHostRegister_v2(host.data(), bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
  CHECK(driver().live_objects() == live_before + 1);
  CUdeviceptr mapped = 0;
  REQUIRE_CU(s.sut.cuMemHostGetDevicePointer_v2(&mapped, host.data() + 10, 0));
  CHECK(mapped == reinterpret_cast<CUdeviceptr>(host.data() + 10));
  CHECK_CU(s.sut.cuMemHostRegister_v2(host.data() + 4, 16, 0),
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);

  const CUdeviceptr dev = s.alloc(bytes);
  REQUIRE_CU(s.sut.cuMemsetD32Async(dev, 42, host.size(), s.stream));
  REQUIRE_CU(
      s.sut.cuMemcpyDtoDAsync_v2(reinterpret_cast<CUdeviceptr>(host.data()), dev, bytes, s.stream));
  s.sync();
  CHECK(host[0] == 42);
  CHECK(host[1023] == 42);

  REQUIRE_CU(s.sut.cuMemHostUnregister(host.data()));
  CHECK(driver().live_objects() == live_before + 1);  // the allocation
  CHECK_CU(s.sut.cuMemHostUnregister(host.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CHECK_CU(s.sut.cuMemHostGetDevicePointer_v2(&mapped, host.data(), 0), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

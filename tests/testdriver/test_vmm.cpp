// Virtual memory management: granularity, reservations, physical allocations, mappings, access
// flags, and the driver's refusals (virtual_memory.cpp).
#include <dlfcn.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr std::size_t kGranule = std::size_t{2} << 20;

CUmemAllocationProp device_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUmemAccessDesc access(CUdevice device, CUmemAccess_flags flags) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = flags;
  return desc;
}

template <class Fn>
Fn* entry_point(const char* name) {
  return reinterpret_cast<Fn*>(dlsym(driver().handle, name));
}

TEST_CASE("VMM sizes follow the 2 MiB granularity and bad arguments are refused", "[vmm]") {
  Session s;
  const CUmemAllocationProp prop = device_prop(s.device);
  std::size_t granularity = 0;
  REQUIRE_CU(
      s.sut.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(granularity == kGranule);

  CUmemGenericAllocationHandle h = 0;
  CHECK_CU(s.sut.cuMemCreate(&h, kGranule + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemCreate(&h, kGranule, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp host = prop;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CHECK_CU(s.sut.cuMemCreate(&h, kGranule, &host, 0), CUDA_ERROR_NOT_SUPPORTED);
  std::size_t free_bytes = 0, total = 0;
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_bytes, &total));
  CHECK_CU(s.sut.cuMemCreate(&h, total + kGranule, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);

  CUdeviceptr va = 0;
  CHECK_CU(s.sut.cuMemAddressReserve(&va, kGranule + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuMemAddressReserve(&va, 4 * kGranule, 0, 0, 0));
  CHECK(va % kGranule == 0);
  REQUIRE_CU(s.sut.cuMemCreate(&h, 2 * kGranule, &prop, 0));
  CHECK_CU(s.sut.cuMemMap(va + 4096, kGranule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemMap(va, kGranule, 4096, h, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuMemMap(va, 3 * kGranule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // > the handle
  CHECK_CU(s.sut.cuMemMap(va + 3 * kGranule, 2 * kGranule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuMemMap(va, kGranule, kGranule, h, 0));  // the handle's second granule
  CHECK_CU(s.sut.cuMemMap(va, kGranule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);     // already mapped
  CHECK_CU(s.sut.cuMemAddressFree(va, 4 * kGranule), CUDA_ERROR_INVALID_VALUE);  // still mapped
  CHECK_CU(s.sut.cuMemUnmap(va, kGranule / 2), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuMemUnmap(va, kGranule));
  REQUIRE_CU(s.sut.cuMemRelease(h));
  CHECK_CU(s.sut.cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuMemAddressFree(va, 4 * kGranule));
}

TEST_CASE("mapped memory is reached only with read-write access, across mappings", "[vmm]") {
  Session s;
  const int live_before = driver().live_objects();
  std::size_t free_before = 0, free_now = 0, total = 0;
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_before, &total));
  const CUmemAllocationProp prop = device_prop(s.device);
  CUdeviceptr va = 0;
  REQUIRE_CU(s.sut.cuMemAddressReserve(&va, 8 * kGranule, 0, 0, 0));
  CUmemGenericAllocationHandle a = 0, b = 0;
  REQUIRE_CU(s.sut.cuMemCreate(&a, kGranule, &prop, 0));
  REQUIRE_CU(s.sut.cuMemCreate(&b, kGranule, &prop, 0));
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_now, &total));
  CHECK(free_before - free_now == 2 * kGranule);
  REQUIRE_CU(s.sut.cuMemMap(va, kGranule, 0, a, 0));
  REQUIRE_CU(s.sut.cuMemMap(va + kGranule, kGranule, 0, b, 0));

  std::vector<std::uint32_t> pattern(kGranule / sizeof(std::uint32_t));
  std::iota(pattern.begin(), pattern.end(), 1u);
  const CUdeviceptr straddle = va + kGranule / 2;
  const std::size_t bytes = pattern.size() * sizeof(std::uint32_t);
  CHECK_CU(s.sut.cuMemcpyHtoDAsync_v2(straddle, pattern.data(), bytes, s.stream),
           CUDA_ERROR_INVALID_VALUE);  // no access yet

  const CUmemAccessDesc read_only = access(s.device, CU_MEM_ACCESS_FLAGS_PROT_READ);
  REQUIRE_CU(s.sut.cuMemSetAccess(va, 2 * kGranule, &read_only, 1));
  CHECK_CU(s.sut.cuMemcpyHtoDAsync_v2(straddle, pattern.data(), bytes, s.stream),
           CUDA_ERROR_INVALID_VALUE);  // the model reaches only read-write memory
  const CUmemAccessDesc read_write = access(s.device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_CU(s.sut.cuMemSetAccess(va, kGranule / 2, &read_write, 1), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuMemSetAccess(va, 2 * kGranule, &read_write, 1));
  auto get_access = entry_point<CUresult(unsigned long long*, const CUmemLocation*, CUdeviceptr)>(
      "cuMemGetAccess");
  unsigned long long flags = 0;
  REQUIRE_CU(get_access(&flags, &read_write.location, va + kGranule));
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  s.upload(straddle, pattern);
  CHECK(s.download<std::uint32_t>(straddle, pattern.size()) == pattern);
  // A kernel sees the two mappings as one range too.
  CUfunction increment = s.function("increment_i32");
  CUdeviceptr p = straddle;
  int n = static_cast<int>(pattern.size());
  void* params[] = {&p, &n};
  REQUIRE_CU(s.sut.cuLaunchKernel(increment, 4, 1, 1, 64, 1, 1, 0, s.stream, params, nullptr));
  const auto back = s.download<std::uint32_t>(straddle, pattern.size());
  CHECK(back.front() == 2);
  CHECK(back.back() == pattern.back() + 1);

  auto retain =
      entry_point<CUresult(CUmemGenericAllocationHandle*, void*)>("cuMemRetainAllocationHandle");
  CUmemGenericAllocationHandle retained = 0;
  REQUIRE_CU(retain(&retained, reinterpret_cast<void*>(va + kGranule + 8)));
  CHECK(retained == b);
  REQUIRE_CU(s.sut.cuMemRelease(retained));
  // Released while mapped: kept until unmapped.
  REQUIRE_CU(s.sut.cuMemRelease(a));
  REQUIRE_CU(s.sut.cuMemRelease(b));
  CHECK(s.download<std::uint32_t>(va + kGranule, 1).front() == back[pattern.size() / 2]);
  REQUIRE_CU(s.sut.cuMemUnmap(va, 2 * kGranule));
  CHECK_CU(s.sut.cuMemcpyHtoDAsync_v2(va, pattern.data(), 4, s.stream), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuMemAddressFree(va, 8 * kGranule));
  REQUIRE_CU(s.sut.cuMemGetInfo_v2(&free_now, &total));
  CHECK(free_now == free_before);
  CHECK(driver().live_objects() == live_before);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

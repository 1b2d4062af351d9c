// cuInit, device queries, primary contexts, limits and error strings.
#include <cstring>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr int kDevicesInTestEnv = 2;                   // MPSSHIM_TESTDRIVER_DEVICES in meson.build
constexpr std::size_t kMemoryInTestEnv = 1024u << 20;  // MPSSHIM_TESTDRIVER_MEMORY_MB

TEST_CASE("isolated: before cuInit", "[.isolated]") {
  const auto& sut = driver().api;
  int count = -1;
  CHECK_CU(sut.cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  int version = 0;
  CHECK_CU(sut.cuDriverGetVersion(&version), CUDA_SUCCESS);
  CHECK(version == 13000);
  CHECK_CU(sut.cuInit(1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(sut.cuInit(0), CUDA_SUCCESS);
  CHECK_CU(sut.cuDeviceGetCount(&count), CUDA_SUCCESS);
}

TEST_CASE("the driver refuses to work before cuInit", "[device]") {
  CHECK(run_isolated("isolated: before cuInit") == 0);
}

TEST_CASE("isolated: device count from the environment", "[.isolated]") {
  const auto& sut = driver().api;
  const std::string wanted = std::getenv("EXPECTED_DEVICES");
  if (wanted == "none") {
    CHECK_CU(sut.cuInit(0), CUDA_ERROR_NO_DEVICE);
    return;
  }
  REQUIRE_CU(sut.cuInit(0));
  int count = 0;
  REQUIRE_CU(sut.cuDeviceGetCount(&count));
  CHECK(count == std::stoi(wanted));
  std::size_t bytes = 0;
  REQUIRE_CU(sut.cuDeviceTotalMem_v2(&bytes, 0));
  CHECK(bytes == std::stoull(std::getenv("EXPECTED_BYTES")));
}

TEST_CASE("MPSSHIM_TESTDRIVER_DEVICES and _MEMORY_MB shape the devices", "[device]") {
  CHECK(run_isolated("isolated: device count from the environment",
                     {{"MPSSHIM_TESTDRIVER_DEVICES", "3"},
                      {"MPSSHIM_TESTDRIVER_MEMORY_MB", "64"},
                      {"EXPECTED_DEVICES", "3"},
                      {"EXPECTED_BYTES", std::to_string(64u << 20)}}) == 0);
  CHECK(run_isolated("isolated: device count from the environment",
                     {{"MPSSHIM_TESTDRIVER_DEVICES", "20"},
                      {"MPSSHIM_TESTDRIVER_MEMORY_MB", ""},
                      {"EXPECTED_DEVICES", "8"},
                      {"EXPECTED_BYTES", std::to_string(16384ull << 20)}}) == 0);
  CHECK(run_isolated("isolated: device count from the environment",
                     {{"MPSSHIM_TESTDRIVER_DEVICES", "0"}, {"EXPECTED_DEVICES", "none"}}) == 0);
}

TEST_CASE("devices look like H100/H200s", "[device]") {
  const auto& sut = driver().api;
  REQUIRE_CU(sut.cuInit(0));
  int count = 0;
  REQUIRE_CU(sut.cuDeviceGetCount(&count));
  REQUIRE(count == kDevicesInTestEnv);

  CUdevice dev = -1;
  REQUIRE_CU(sut.cuDeviceGet(&dev, 1));
  CHECK(dev == 1);
  CHECK_CU(sut.cuDeviceGet(&dev, kDevicesInTestEnv), CUDA_ERROR_INVALID_DEVICE);

  char name[64] = {};
  REQUIRE_CU(sut.cuDeviceGetName(name, sizeof name, 1));
  CHECK(std::string(name) == "mpsshim test device 1");
  char shortname[8] = {};
  REQUIRE_CU(sut.cuDeviceGetName(shortname, sizeof shortname, 0));
  CHECK(std::string(shortname) == "mpsshim");

  CUuuid a{}, a_again{}, b{};
  REQUIRE_CU(sut.cuDeviceGetUuid_v2(&a, 0));
  REQUIRE_CU(sut.cuDeviceGetUuid_v2(&a_again, 0));
  REQUIRE_CU(sut.cuDeviceGetUuid_v2(&b, 1));
  CHECK(std::memcmp(a.bytes, a_again.bytes, sizeof a.bytes) == 0);
  CHECK(std::memcmp(a.bytes, b.bytes, sizeof a.bytes) != 0);

  std::size_t total = 0;
  REQUIRE_CU(sut.cuDeviceTotalMem_v2(&total, 0));
  CHECK(total == kMemoryInTestEnv);

  const std::pair<CUdevice_attribute, int> expected[] = {
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
      {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20},
      {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 7},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
      {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
      {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 0},  // unmodelled: 0, not an error
  };
  for (const auto& [attrib, value] : expected) {
    INFO("attribute " << attrib);
    int got = -1;
    REQUIRE_CU(sut.cuDeviceGetAttribute(&got, attrib, 1));
    CHECK(got == value);
  }
  int got = 0;
  CHECK_CU(sut.cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(sut.cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2),
           CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("the primary context is reference counted and current per thread", "[context]") {
  const auto& sut = driver().api;
  REQUIRE_CU(sut.cuInit(0));
  CUcontext first = nullptr, second = nullptr;
  REQUIRE_CU(sut.cuDevicePrimaryCtxRetain(&first, 1));
  REQUIRE_CU(sut.cuDevicePrimaryCtxRetain(&second, 1));
  CHECK(first == second);

  REQUIRE_CU(sut.cuCtxSetCurrent(first));
  CUdeviceptr p = 0;
  REQUIRE_CU(sut.cuMemAlloc_v2(&p, 1024));
  const int with_allocation = driver().live_objects();

  REQUIRE_CU(sut.cuDevicePrimaryCtxRelease_v2(1));
  CHECK(driver().live_objects() == with_allocation);  // still retained once
  REQUIRE_CU(sut.cuDevicePrimaryCtxRelease_v2(1));
  CHECK(driver().live_objects() == with_allocation - 1);  // the last release destroys its objects
  CHECK_CU(sut.cuMemAlloc_v2(&p, 1024), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(sut.cuCtxSetCurrent(first), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(sut.cuDevicePrimaryCtxRelease_v2(1), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(sut.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
}

TEST_CASE("limits keep what was set", "[context]") {
  Session session;
  const auto& sut = session.sut;
  std::size_t value = 0;
  REQUIRE_CU(sut.cuCtxGetLimit(&value, CU_LIMIT_STACK_SIZE));
  CHECK(value == 1024);
  REQUIRE_CU(sut.cuCtxGetLimit(&value, CU_LIMIT_PRINTF_FIFO_SIZE));
  CHECK(value == 1u << 20);
  REQUIRE_CU(sut.cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE));
  CHECK(value == 8u << 20);
  REQUIRE_CU(sut.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 64u << 20));
  REQUIRE_CU(sut.cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE));
  CHECK(value == 64u << 20);
  CHECK_CU(sut.cuCtxSetLimit(CU_LIMIT_MAX, 1), CUDA_ERROR_INVALID_VALUE);

  int least = 1, greatest = 1;
  REQUIRE_CU(sut.cuCtxGetStreamPriorityRange(&least, &greatest));
  CHECK(least == 0);
  CHECK(greatest == -5);
}

TEST_CASE("error names and strings", "[errors]") {
  const auto& sut = driver().api;
  const char* text = nullptr;
  REQUIRE_CU(sut.cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &text));
  CHECK(std::string(text) == "CUDA_ERROR_INVALID_VALUE");
  REQUIRE_CU(sut.cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &text));
  CHECK(std::string(text) == "an illegal memory access was encountered");
  REQUIRE_CU(sut.cuGetErrorName(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, &text));
  CHECK(std::string(text) == "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION");
  CHECK_CU(sut.cuGetErrorName(static_cast<CUresult>(12345), &text), CUDA_ERROR_INVALID_VALUE);
  CHECK(text == nullptr);
}

TEST_CASE("a forked child has no driver", "[device]") {
  const auto& sut = driver().api;
  REQUIRE_CU(sut.cuInit(0));
  const int status = run_forked([&] {
    int count = 0;
    return sut.cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1;
  });
  CHECK(status == 0);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

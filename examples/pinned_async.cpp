// Page-locked host memory and memsets:
//  1. cuMemAllocHost buffer -> async H2D -> increment_i32 -> async D2H into a
//     cuMemHostAlloc(DEVICEMAP | PORTABLE) buffer;
//  2. zero copy: fill_u32 then increment_i32 run on the mapped buffer itself, through the
//     pointer cuMemHostGetDevicePointer gives, and the host reads the result without a copy;
//  3. cuMemsetD8/D16/D32 and their Async forms at odd offsets and lengths, each checked against
//     a host shadow of the whole buffer so that a memset writing too much is caught too.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kFillValue = 0xC0FFEE00u;

long long count_int_mismatches(const std::int32_t* got, const std::int32_t* expected, int n,
                               const char* what) {
  long long mismatches = 0;
  for (int i = 0; i < n; ++i) {
    if (got[i] != expected[i]) {
      if (mismatches == 0) {
        std::fprintf(stderr, "pinned_async: %s[%d] = 0x%08x, expected 0x%08x\n", what, i,
                     static_cast<unsigned>(got[i]), static_cast<unsigned>(expected[i]));
      }
      ++mismatches;
    }
  }
  return mismatches;
}

// One memset of the sequence: `count` elements of `width` bytes at byte `offset`.
struct MemsetCase {
  const char* name;
  int width;
  std::size_t offset;
  std::size_t count;
  unsigned value;
  bool async;
};

CUresult run_memset(const MemsetCase& c, CUdeviceptr base, CUstream stream) {
  const CUdeviceptr at = base + c.offset;
  switch (c.width) {
    case 1:
      return c.async ? cuMemsetD8Async(at, static_cast<unsigned char>(c.value), c.count, stream)
                     : cuMemsetD8(at, static_cast<unsigned char>(c.value), c.count);
    case 2:
      return c.async ? cuMemsetD16Async(at, static_cast<unsigned short>(c.value), c.count, stream)
                     : cuMemsetD16(at, static_cast<unsigned short>(c.value), c.count);
    default:
      return c.async ? cuMemsetD32Async(at, c.value, c.count, stream)
                     : cuMemsetD32(at, c.value, c.count);
  }
}

void apply_memset(const MemsetCase& c, std::vector<unsigned char>& shadow) {
  for (std::size_t i = 0; i < c.count; ++i) {
    std::memcpy(&shadow[c.offset + i * c.width], &c.value, c.width);  // little-endian low bytes
  }
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("pinned_async");
  ex::Cli cli(argc, argv, "[--n INTS (1M)] [--device ORDINAL]");
  const auto n = static_cast<int>(cli.integer("--n", 1 << 20, 4096, 1 << 28));
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction increment = ex::get_function(module, "increment_i32");
  CUfunction fill = ex::get_function(module, "fill_u32");
  const std::size_t bytes = sizeof(std::int32_t) * static_cast<std::size_t>(n);
  const unsigned blocks = ex::blocks_for(n, kThreads);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  std::int32_t* pinned = nullptr;
  std::int32_t* mapped = nullptr;
  CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), bytes));
  CU_CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&mapped), bytes,
                          CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr device_buffer = 0;
  CU_CHECK(cuMemAlloc(&device_buffer, bytes));

  // 1. Pinned round trip through the device.
  std::vector<std::int32_t> expected(n);
  for (int i = 0; i < n; ++i) {
    pinned[i] = 3 * i - n;
    expected[i] = pinned[i] + 1;
    mapped[i] = -1;
  }
  auto start = ex::Clock::now();
  CU_CHECK(cuMemcpyHtoDAsync(device_buffer, pinned, bytes, stream));
  CU_CHECK(ex::launch_kernel(increment, {blocks}, {kThreads}, stream, device_buffer, n));
  CU_CHECK(cuMemcpyDtoHAsync(mapped, device_buffer, bytes, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  const double round_trip_ms = 1e3 * ex::seconds_since(start);
  const long long async_mismatches = count_int_mismatches(mapped, expected.data(), n, "round_trip");
  const std::string round_trip_checksum = ex::checksum(mapped, bytes);

  // 2. Zero copy: the kernels write host memory through its device alias.
  CUdeviceptr mapped_alias = 0;
  CU_CHECK(cuMemHostGetDevicePointer(&mapped_alias, mapped, 0));
  start = ex::Clock::now();
  CU_CHECK(ex::launch_kernel(fill, {blocks}, {kThreads}, stream, mapped_alias, kFillValue, n));
  CU_CHECK(ex::launch_kernel(increment, {blocks}, {kThreads}, stream, mapped_alias, n));
  CU_CHECK(cuStreamSynchronize(stream));
  const double zero_copy_ms = 1e3 * ex::seconds_since(start);
  const std::vector<std::int32_t> filled(n, static_cast<std::int32_t>(kFillValue + 1));
  const long long zero_copy_mismatches = count_int_mismatches(mapped, filled.data(), n, "mapped");

  // 3. Memsets over a cleared buffer, in order; the shadow follows every one.
  const MemsetCase cases[] = {
      {"memset_d8", 1, 3, 1001, 0xABu, false},
      {"memset_d16", 2, 2 * 5, 777, 0xBEEFu, false},
      {"memset_d32", 4, 4 * 301, 999, 0xDEADBEEFu, false},
      {"memset_d8_async", 1, 4 * 1000 + 1, 333, 0x5Au, true},
      {"memset_d16_async", 2, 2 * 2999, 501, 0x1234u, true},
      {"memset_d32_async", 4, 4 * 3300, 700, 0x89ABCDEFu, true},
  };
  const std::size_t memset_bytes = 4 * 4096;
  std::vector<unsigned char> shadow(memset_bytes, 0);
  CU_CHECK(cuMemsetD32(device_buffer, 0, memset_bytes / 4));
  long long memset_failures = 0;
  std::vector<std::pair<const char*, const char*>> memset_results;
  auto* readback = reinterpret_cast<unsigned char*>(pinned);
  for (const auto& c : cases) {
    CU_CHECK(run_memset(c, device_buffer, stream));
    apply_memset(c, shadow);
    if (c.async) {
      CU_CHECK(cuMemcpyDtoHAsync(readback, device_buffer, memset_bytes, stream));
      CU_CHECK(cuStreamSynchronize(stream));
    } else {
      CU_CHECK(cuMemcpyDtoH(readback, device_buffer, memset_bytes));
    }
    const bool ok = std::memcmp(readback, shadow.data(), memset_bytes) == 0;
    if (!ok) {
      std::fprintf(stderr, "pinned_async: %s: buffer differs from the expected bytes\n", c.name);
      ++memset_failures;
    }
    memset_results.emplace_back(c.name, ok ? "ok" : "wrong");
  }

  report.add("n", n);
  report.add("async_mismatches", async_mismatches);
  report.add("zero_copy_mismatches", zero_copy_mismatches);
  report.add("checksum", round_trip_checksum);
  for (const auto& [name, verdict] : memset_results) report.add(name, verdict);
  report.add_fixed("round_trip_ms", round_trip_ms, 3);
  report.add_fixed("zero_copy_ms", zero_copy_ms, 3);
  report.expect(async_mismatches == 0, "async_mismatches");
  report.expect(zero_copy_mismatches == 0, "zero_copy_mismatches");
  report.expect(memset_failures == 0, "memset");

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuMemFree(device_buffer));
  CU_CHECK(cuMemFreeHost(pinned));
  CU_CHECK(cuMemFreeHost(mapped));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}

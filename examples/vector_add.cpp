// c = a + b over n floats, twice: with synchronous copies from pageable memory on the legacy
// default stream, then with asynchronous copies (still pageable memory) on a created stream.
// Each pass uses fresh inputs, so a stale result from the other pass cannot pass the check.
#include <cuda.h>

#include <cstdio>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

constexpr unsigned kThreads = 256;

// Exact comparison: one IEEE addition gives the same bits on the GPU and the CPU.
long long count_mismatches(const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<float>& c, const char* pass) {
  long long mismatches = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] != a[i] + b[i]) {
      if (mismatches == 0) {
        std::fprintf(stderr, "vector_add: %s pass: c[%zu] = %g, expected %g\n", pass, i, c[i],
                     a[i] + b[i]);
      }
      ++mismatches;
    }
  }
  return mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("vector_add");
  ex::Cli cli(argc, argv, "[--n ELEMENTS (1M)] [--device ORDINAL (0)]");
  const auto n = static_cast<int>(cli.integer("--n", 1 << 20, 1, 1 << 28));
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction vector_add = ex::get_function(module, "vector_add");

  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n);
  CUdeviceptr da = 0, db = 0, dc = 0;
  CU_CHECK(cuMemAlloc(&da, bytes));
  CU_CHECK(cuMemAlloc(&db, bytes));
  CU_CHECK(cuMemAlloc(&dc, bytes));
  const unsigned blocks = ex::blocks_for(n, kThreads);

  // Pass 1: synchronous copies; the launch goes to the legacy default stream (0), which orders
  // it after the copies before it and before the copy after it.
  const auto sync_a = ex::random_floats(n, 1);
  const auto sync_b = ex::random_floats(n, 2);
  std::vector<float> sync_c(n);
  auto start = ex::Clock::now();
  CU_CHECK(cuMemcpyHtoD(da, sync_a.data(), bytes));
  CU_CHECK(cuMemcpyHtoD(db, sync_b.data(), bytes));
  CU_CHECK(ex::launch_kernel(vector_add, {blocks}, {kThreads}, nullptr, da, db, dc, n));
  CU_CHECK(cuMemcpyDtoH(sync_c.data(), dc, bytes));
  const double sync_ms = 1e3 * ex::seconds_since(start);

  // Pass 2: asynchronous copies on a blocking stream, which also orders after the memset that
  // the legacy stream runs first.
  const auto async_a = ex::random_floats(n, 3);
  const auto async_b = ex::random_floats(n, 4);
  std::vector<float> async_c(n);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
  CU_CHECK(cuMemsetD32(dc, 0xFFFFFFFFu, n));  // NaN: a skipped kernel cannot leave old sums
  start = ex::Clock::now();
  CU_CHECK(cuMemcpyHtoDAsync(da, async_a.data(), bytes, stream));
  CU_CHECK(cuMemcpyHtoDAsync(db, async_b.data(), bytes, stream));
  CU_CHECK(ex::launch_kernel(vector_add, {blocks}, {kThreads}, stream, da, db, dc, n));
  CU_CHECK(cuMemcpyDtoHAsync(async_c.data(), dc, bytes, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  const double async_ms = 1e3 * ex::seconds_since(start);

  const long long sync_mismatches = count_mismatches(sync_a, sync_b, sync_c, "sync");
  const long long async_mismatches = count_mismatches(async_a, async_b, async_c, "async");
  report.add("n", n);
  report.add("sync_mismatches", sync_mismatches);
  report.add("async_mismatches", async_mismatches);
  report.add("checksum", ex::checksum(async_c.data(), bytes));
  report.add_fixed("sync_ms", sync_ms, 3);
  report.add_fixed("async_ms", async_ms, 3);
  report.expect(sync_mismatches == 0, "sync_mismatches");
  report.expect(async_mismatches == 0, "async_mismatches");

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuMemFree(da));
  CU_CHECK(cuMemFree(db));
  CU_CHECK(cuMemFree(dc));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}

// C = A * B (row-major, M x K times K x N) through the path the CUDA runtime takes:
// cuLibraryLoadData + cuLibraryGetKernel, a context-less CUkernel launched with cuLaunchKernel;
// then the same product again through cuKernelGetFunction + cuLaunchKernelEx. Both results are
// checked against a double-precision CPU product and must be bit-identical to each other.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

constexpr unsigned kTile = 16;  // matmul_tiled's tile edge (examples/kernels/matmul.cu)

std::vector<double> cpu_product(const std::vector<float>& a, const std::vector<float>& b, int m,
                                int n, int k) {
  std::vector<double> c(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      const double aip = a[static_cast<std::size_t>(i) * k + p];
      const float* b_row = &b[static_cast<std::size_t>(p) * n];
      double* c_row = &c[static_cast<std::size_t>(i) * n];
      for (int j = 0; j < n; ++j) c_row[j] += aip * b_row[j];
    }
  }
  return c;
}

double max_abs_error(const std::vector<float>& gpu, const std::vector<double>& cpu) {
  double worst = 0.0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double error = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    worst = std::isnan(error) ? INFINITY : std::max(worst, error);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("matmul_tiled");
  ex::Cli cli(argc, argv, "[--m ROWS (512)] [--n COLS (512)] [--k INNER (512)] [--device ORDINAL]");
  // Not const: cuLaunchKernelEx takes their addresses as kernel parameters.
  int m = static_cast<int>(cli.integer("--m", 512, 1, 8192));
  int n = static_cast<int>(cli.integer("--n", 512, 1, 8192));
  int k = static_cast<int>(cli.integer("--k", 512, 1, 8192));
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUlibrary library = nullptr;
  CU_CHECK(cuLibraryLoadData(&library, ex::kDeviceImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  CU_CHECK(cuLibraryGetKernel(&kernel, library, "matmul_tiled"));
  int max_threads = 0;
  CU_CHECK(cuKernelGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel,
                                device.device));
  report.expect(max_threads >= static_cast<int>(kTile * kTile), "max_threads_per_block");

  const auto a = ex::random_floats(static_cast<std::size_t>(m) * k, 11);
  const auto b = ex::random_floats(static_cast<std::size_t>(k) * n, 12);
  const std::size_t a_bytes = sizeof(float) * a.size();
  const std::size_t b_bytes = sizeof(float) * b.size();
  const std::size_t c_bytes = sizeof(float) * static_cast<std::size_t>(m) * n;
  CUdeviceptr da = 0, db = 0, dc_plain = 0, dc_ex = 0;
  CU_CHECK(cuMemAlloc(&da, a_bytes));
  CU_CHECK(cuMemAlloc(&db, b_bytes));
  CU_CHECK(cuMemAlloc(&dc_plain, c_bytes));
  CU_CHECK(cuMemAlloc(&dc_ex, c_bytes));
  CU_CHECK(cuMemcpyHtoD(da, a.data(), a_bytes));
  CU_CHECK(cuMemcpyHtoD(db, b.data(), b_bytes));

  // A blocking stream: it orders after the legacy-stream copies above, whose DMA from pageable
  // memory may still be in flight when cuMemcpyHtoD returns.
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
  const ex::Dim3 grid{(n + kTile - 1) / kTile, (m + kTile - 1) / kTile, 1};
  const ex::Dim3 block{kTile, kTile, 1};

  const auto start = ex::Clock::now();
  // A CUkernel stands in for a CUfunction; the stream names the context.
  CU_CHECK(ex::launch_kernel(reinterpret_cast<CUfunction>(kernel), grid, block, stream, da, db,
                             dc_plain, m, n, k));
  CU_CHECK(cuStreamSynchronize(stream));
  const double kernel_ms = 1e3 * ex::seconds_since(start);

  CUfunction function = nullptr;
  CU_CHECK(cuKernelGetFunction(&function, kernel));
  CUlaunchConfig config{};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = 1;
  config.blockDimX = block.x;
  config.blockDimY = block.y;
  config.blockDimZ = 1;
  config.hStream = stream;
  void* params[] = {&da, &db, &dc_ex, &m, &n, &k};
  CU_CHECK(cuLaunchKernelEx(&config, function, params, nullptr));
  CU_CHECK(cuStreamSynchronize(stream));

  std::vector<float> c_plain(static_cast<std::size_t>(m) * n);
  std::vector<float> c_ex(c_plain.size());
  CU_CHECK(cuMemcpyDtoH(c_plain.data(), dc_plain, c_bytes));
  CU_CHECK(cuMemcpyDtoH(c_ex.data(), dc_ex, c_bytes));

  const auto reference = cpu_product(a, b, m, n, k);
  const double error = max_abs_error(c_plain, reference);
  // Worst case for |a|,|b| < 1: K products and K additions, each rounding off at most
  // 2^-24 * (a partial sum <= K). A wrong tile or index is off by ~sqrt(K)/3, far above this.
  const double tolerance = std::ldexp((k + 1.0) * k, -24);
  const bool identical = std::memcmp(c_plain.data(), c_ex.data(), c_bytes) == 0;

  report.add("m", m);
  report.add("n", n);
  report.add("k", k);
  report.add_real("max_abs_err", error);
  report.add_real("tolerance", tolerance);
  report.add("ex_identical", identical ? 1 : 0);
  report.add("checksum", ex::checksum(c_plain.data(), c_bytes));
  report.add_fixed("kernel_ms", kernel_ms, 3);
  report.expect(error <= tolerance, "max_abs_err");
  report.expect(identical, "ex_identical");

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuMemFree(da));
  CU_CHECK(cuMemFree(db));
  CU_CHECK(cuMemFree(dc_plain));
  CU_CHECK(cuMemFree(dc_ex));
  CU_CHECK(cuLibraryUnload(library));
  ex::close_device(device);
  return report.finish();
}

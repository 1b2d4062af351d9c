// Modules, libraries, kernels by name, their parameters and attributes, launches and occupancy.
#include <cmath>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr char kImage[] = "any bytes: the test driver finds kernels by name";

struct Param {
  std::size_t offset;
  std::size_t size;
  bool operator==(const Param&) const = default;
};

std::vector<Param> params_of(CUfunction f) {
  std::vector<Param> out;
  for (std::size_t i = 0;; ++i) {
    Param p{};
    const CUresult r = driver().api.cuFuncGetParamInfo(f, i, &p.offset, &p.size);
    if (r == CUDA_ERROR_INVALID_VALUE) return out;
    REQUIRE_CU(r);
    out.push_back(p);
  }
}

TEST_CASE("kernels are found by name in any image", "[modules]") {
  Session s;
  const int live_before = driver().live_objects();
  CUmodule m = nullptr;
  CHECK_CU(s.sut.cuModuleLoadData(&m, nullptr), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuModuleLoadData(&m, kImage));
  CHECK(driver().live_objects() == live_before + 1);

  CUfunction f = nullptr, again = nullptr;
  REQUIRE_CU(s.sut.cuModuleGetFunction(&f, m, "vector_add"));
  REQUIRE_CU(s.sut.cuModuleGetFunction(&again, m, "vector_add"));
  CHECK(f == again);
  CHECK_CU(s.sut.cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);

  CUdeviceptr global = 0;
  std::size_t size = 0;
  REQUIRE_CU(s.sut.cuModuleGetGlobal_v2(&global, &size, m, "test_global"));
  CHECK(size == 256);
  CHECK(s.download<std::uint8_t>(global, 256) == std::vector<std::uint8_t>(256, 0));
  CHECK_CU(s.sut.cuModuleGetGlobal_v2(&global, &size, m, "other"), CUDA_ERROR_NOT_FOUND);

  REQUIRE_CU(s.sut.cuModuleUnload(m));
  CHECK(driver().live_objects() == live_before);
  CHECK_CU(s.sut.cuModuleGetFunction(&f, m, "vector_add"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(s.sut.cuFuncGetParamInfo(again, 0, &size, nullptr), CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("parameter layouts follow the CUDA ABI", "[modules]") {
  Session s;
  CHECK(params_of(s.function("vector_add")) ==
        std::vector<Param>{{0, 8}, {8, 8}, {16, 8}, {24, 4}});
  CHECK(params_of(s.function("matmul_tiled")) ==
        std::vector<Param>{{0, 8}, {8, 8}, {16, 8}, {24, 4}, {28, 4}, {32, 4}});
  CHECK(params_of(s.function("scale_add")) == std::vector<Param>{{0, 8}, {8, 8}, {16, 4}, {20, 4}});
  CHECK(params_of(s.function("spin_kernel")) == std::vector<Param>{{0, 8}});
  CHECK(params_of(s.function("empty_kernel")).empty());
}

TEST_CASE("libraries hand out kernels, their functions and their module", "[modules]") {
  Session s;
  const int live_before = driver().live_objects();
  CUlibrary lib = nullptr;
  REQUIRE_CU(s.sut.cuLibraryLoadData(&lib, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CHECK(driver().live_objects() == live_before + 1);
  CUkernel k = nullptr;
  REQUIRE_CU(s.sut.cuLibraryGetKernel(&k, lib, "fill_u32"));
  CHECK_CU(s.sut.cuLibraryGetKernel(&k, lib, "nope"), CUDA_ERROR_NOT_FOUND);
  REQUIRE_CU(s.sut.cuLibraryGetKernel(&k, lib, "fill_u32"));

  std::size_t offset = 0, size = 0;
  REQUIRE_CU(s.sut.cuKernelGetParamInfo(k, 1, &offset, &size));
  CHECK(offset == 8);
  CHECK(size == 4);
  CHECK_CU(s.sut.cuKernelGetParamInfo(k, 3, &offset, &size), CUDA_ERROR_INVALID_VALUE);
  // The real driver's quirk (measured): a CUkernel is not a CUfunction here.
  CHECK_CU(s.sut.cuFuncGetParamInfo(reinterpret_cast<CUfunction>(k), 1, &offset, &size),
           CUDA_ERROR_INVALID_HANDLE);

  CUfunction f = nullptr, from_module = nullptr;
  REQUIRE_CU(s.sut.cuKernelGetFunction(&f, k));
  REQUIRE_CU(s.sut.cuFuncGetParamInfo(f, 1, &offset, &size));
  CHECK(offset == 8);
  CUmodule m = nullptr;
  REQUIRE_CU(s.sut.cuLibraryGetModule(&m, lib));
  REQUIRE_CU(s.sut.cuModuleGetFunction(&from_module, m, "fill_u32"));
  CHECK(from_module == f);
  CUdeviceptr global = 0;
  REQUIRE_CU(s.sut.cuLibraryGetGlobal(&global, nullptr, lib, "test_global"));
  CUdeviceptr via_module = 0;
  REQUIRE_CU(s.sut.cuModuleGetGlobal_v2(&via_module, nullptr, m, "test_global"));
  CHECK(global == via_module);

  REQUIRE_CU(s.sut.cuLibraryUnload(lib));
  CHECK(driver().live_objects() == live_before);
  CHECK_CU(s.sut.cuKernelGetFunction(&f, k), CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("function attributes, settable ones shared between a kernel and its function",
          "[modules]") {
  Session s;
  CUfunction f = s.function("vector_add");
  int v = 0;
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
  CHECK(v == 1024);
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  CHECK(v == 32);
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_BINARY_VERSION, f));
  CHECK(v == 90);
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
  CHECK(v == 49152);
  REQUIRE_CU(s.sut.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000));
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
  CHECK(v == 100000);
  CHECK_CU(s.sut.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 300000),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX, f), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuFuncSetCacheConfig(f, CU_FUNC_CACHE_PREFER_SHARED));

  CUlibrary lib = nullptr;
  REQUIRE_CU(s.sut.cuLibraryLoadData(&lib, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr;
  REQUIRE_CU(s.sut.cuLibraryGetKernel(&k, lib, "vector_add"));
  REQUIRE_CU(s.sut.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536, k,
                                        s.device));
  CUfunction kf = nullptr;
  REQUIRE_CU(s.sut.cuKernelGetFunction(&kf, k));
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kf));
  CHECK(v == 65536);
  REQUIRE_CU(s.sut.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      reinterpret_cast<CUfunction>(k)));
  CHECK(v == 65536);
  REQUIRE_CU(s.sut.cuKernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_PTX_VERSION, k, s.device));
  CHECK(v == 90);
  REQUIRE_CU(s.sut.cuLibraryUnload(lib));
}

struct VectorAdd {
  static constexpr int kN = 1000;
  std::vector<float> a = std::vector<float>(kN), b = std::vector<float>(kN);
  CUdeviceptr da = 0, db = 0, dc = 0;
  int n = kN;

  explicit VectorAdd(Session& s) {
    for (int i = 0; i < kN; ++i) {
      a[static_cast<std::size_t>(i)] = static_cast<float>(i);
      b[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
    }
    da = s.alloc(kN * sizeof(float));
    db = s.alloc(kN * sizeof(float));
    dc = s.alloc(kN * sizeof(float));
    s.upload(da, a);
    s.upload(db, b);
    REQUIRE_CU(s.sut.cuMemsetD32Async(dc, 0, kN, s.stream));
  }
  void check(Session& s) const {
    const auto c = s.download<float>(dc, kN);
    for (std::size_t i = 0; i < kN; ++i) {
      INFO("element " << i);
      REQUIRE(c[i] == a[i] + b[i]);
    }
  }
};

TEST_CASE("vector_add through kernelParams", "[launch]") {
  Session s;
  VectorAdd data(s);
  void* params[] = {&data.da, &data.db, &data.dc, &data.n};
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("vector_add"), (VectorAdd::kN + 127) / 128, 1, 1, 128,
                                  1, 1, 0, s.stream, params, nullptr));
  data.check(s);
}

TEST_CASE("vector_add through an argument buffer packed at the parameter offsets", "[launch]") {
  Session s;
  VectorAdd data(s);
  CUfunction f = s.function("vector_add");
  const std::vector<Param> layout = params_of(f);
  std::vector<std::byte> buffer(layout.back().offset + layout.back().size);
  const void* values[] = {&data.da, &data.db, &data.dc, &data.n};
  for (std::size_t i = 0; i < layout.size(); ++i)
    std::memcpy(buffer.data() + layout[i].offset, values[i], layout[i].size);
  std::size_t size = buffer.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};

  REQUIRE_CU(s.sut.cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, s.stream, nullptr, extra));
  data.check(s);

  std::size_t short_size = size - 1;
  void* short_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                         &short_size, CU_LAUNCH_PARAM_END};
  CHECK_CU(s.sut.cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, s.stream, nullptr, short_extra),
           CUDA_ERROR_INVALID_VALUE);
  void* params[] = {&data.da, &data.db, &data.dc, &data.n};
  CHECK_CU(s.sut.cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, s.stream, params, extra),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, s.stream, nullptr, nullptr),
           CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("a CUkernel launches through cuLaunchKernelEx", "[launch]") {
  Session s;
  VectorAdd data(s);
  CUlibrary lib = nullptr;
  REQUIRE_CU(s.sut.cuLibraryLoadData(&lib, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr;
  REQUIRE_CU(s.sut.cuLibraryGetKernel(&k, lib, "vector_add"));
  CUlaunchAttribute cluster{};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = 2;
  cluster.value.clusterDim.y = 1;
  cluster.value.clusterDim.z = 1;
  CUlaunchConfig config{};
  config.gridDimX = 8;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = s.stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  void* params[] = {&data.da, &data.db, &data.dc, &data.n};

  REQUIRE_CU(s.sut.cuLaunchKernelEx(&config, reinterpret_cast<CUfunction>(k), params, nullptr));
  data.check(s);

  config.gridDimX = 7;  // not a multiple of the cluster
  CHECK_CU(s.sut.cuLaunchKernelEx(&config, reinterpret_cast<CUfunction>(k), params, nullptr),
           CUDA_ERROR_INVALID_CLUSTER_SIZE);
  config.gridDimX = 16;
  cluster.value.clusterDim.x = 16;  // beyond the portable 8 without opting in
  CHECK_CU(s.sut.cuLaunchKernelEx(&config, reinterpret_cast<CUfunction>(k), params, nullptr),
           CUDA_ERROR_INVALID_CLUSTER_SIZE);
  REQUIRE_CU(s.sut.cuLibraryUnload(lib));
}

TEST_CASE("launch geometry is checked against the device limits", "[launch]") {
  Session s;
  CUfunction f = s.function("empty_kernel");
  auto launch = [&](unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    unsigned shared = 0) {
    return s.sut.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s.stream, nullptr, nullptr);
  };
  CHECK_CU(launch(2147483647, 65535, 65535, 1024, 1, 1), CUDA_SUCCESS);
  CHECK_CU(launch(1, 1, 1, 32, 32, 1), CUDA_SUCCESS);
  CHECK_CU(launch(1, 1, 1, 1025, 1, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(launch(1, 1, 1, 32, 32, 2), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(launch(1, 1, 1, 1, 1, 65), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(launch(1, 65536, 1, 1, 1, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(launch(0, 1, 1, 1, 1, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(launch(1, 1, 1, 1, 1, 1, 49152), CUDA_SUCCESS);
  CHECK_CU(launch(1, 1, 1, 1, 1, 1, 49153), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200000));
  CHECK_CU(launch(1, 1, 1, 1, 1, 1, 200000), CUDA_SUCCESS);
  s.sync();
}

TEST_CASE("matmul_tiled multiplies row-major matrices", "[launch]") {
  Session s;
  int m = 37, n = 19, k = 23;
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) - 3.0f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.25f * static_cast<float>(i % 5);
  CUdeviceptr da = s.alloc(a.size() * 4), db = s.alloc(b.size() * 4);
  CUdeviceptr dc = s.alloc(static_cast<std::size_t>(m * n) * 4);
  s.upload(da, a);
  s.upload(db, b);
  void* params[] = {&da, &db, &dc, &m, &n, &k};
  constexpr unsigned kTile = 16;
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("matmul_tiled"), (n + kTile - 1) / kTile,
                                  (m + kTile - 1) / kTile, 1, kTile, kTile, 1, 0, s.stream, params,
                                  nullptr));
  const auto c = s.download<float>(dc, static_cast<std::size_t>(m * n));
  for (int r = 0; r < m; ++r) {
    for (int col = 0; col < n; ++col) {
      float want = 0;
      for (int i = 0; i < k; ++i)
        want += a[static_cast<std::size_t>(r * k + i)] * b[static_cast<std::size_t>(i * n + col)];
      INFO("C[" << r << "][" << col << "]");
      REQUIRE(c[static_cast<std::size_t>(r * n + col)] == Approx(want));
    }
  }
}

TEST_CASE("elementwise kernels stride over the grid", "[launch]") {
  Session s;
  int n = 300;
  std::vector<float> x(300, 2.0f), y(300, 1.0f);
  CUdeviceptr dx = s.alloc(1200), dy = s.alloc(1200), du = s.alloc(1200);
  s.upload(dx, x);
  s.upload(dy, y);
  float alpha = 3.0f;
  void* scale_params[] = {&dy, &dx, &alpha, &n};
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("scale_add"), 3, 1, 1, 100, 1, 1, 0, s.stream,
                                  scale_params, nullptr));
  unsigned value = 0xdeadbeef;
  void* fill_params[] = {&du, &value, &n};
  // 2 blocks of 100 threads for 300 elements: the grid-stride loop still covers all of them.
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("fill_u32"), 2, 1, 1, 100, 1, 1, 0, s.stream,
                                  fill_params, nullptr));
  const auto ys = s.download<float>(dy, 300);
  const auto us = s.download<unsigned>(du, 300);
  CHECK(ys[0] == 7.0f);
  CHECK(ys[299] == 7.0f);
  CHECK(us[0] == 0xdeadbeef);
  CHECK(us[299] == 0xdeadbeef);
}

TEST_CASE("trigger_fault stores to the address it is given", "[launch]") {
  Session s;
  CUdeviceptr p = s.alloc(sizeof(int));
  void* params[] = {&p};
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("trigger_fault"), 1, 1, 1, 32, 1, 1, 0, s.stream,
                                  params, nullptr));
  CHECK(s.download<int>(p, 1)[0] == 0x0badf00d);  // device memory: no fault, as on the GPU
}

TEST_CASE("occupancy of an H100/H200 SM", "[launch]") {
  Session s;
  CUfunction f = s.function("empty_kernel");
  int blocks = 0;
  REQUIRE_CU(s.sut.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, 256, 0, 0));
  CHECK(blocks == 8);
  REQUIRE_CU(s.sut.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, 32, 0, 0));
  CHECK(blocks == 32);
  REQUIRE_CU(s.sut.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, 1024, 0, 0));
  CHECK(blocks == 2);
  REQUIRE_CU(s.sut.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, 2048, 0, 0));
  CHECK(blocks == 0);

  std::size_t shared = 0;
  REQUIRE_CU(s.sut.cuOccupancyAvailableDynamicSMemPerBlock(&shared, f, 1, 128));
  CHECK(shared == 232448);
  REQUIRE_CU(s.sut.cuOccupancyAvailableDynamicSMemPerBlock(&shared, f, 4, 128));
  CHECK(shared == 232448 / 4);

  CUlaunchAttribute cluster{};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = 2;
  cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
  CUlaunchConfig config{};
  config.gridDimX = 2;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = s.stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  REQUIRE_CU(s.sut.cuOccupancyMaxActiveClusters(&clusters, f, &config));
  CHECK(clusters == 66);
  config.numAttrs = 0;
  CHECK_CU(s.sut.cuOccupancyMaxActiveClusters(&clusters, f, &config),
           CUDA_ERROR_INVALID_CLUSTER_SIZE);
  // The largest cluster: portable, then non-portable once the function allows it.
  int size = 0;
  REQUIRE_CU(s.sut.cuOccupancyMaxPotentialClusterSize(&size, f, &config));
  CHECK(size == 8);
  REQUIRE_CU(s.sut.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
  REQUIRE_CU(s.sut.cuOccupancyMaxPotentialClusterSize(&size, f, &config));
  CHECK(size == 16);
  REQUIRE_CU(s.sut.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 0));
}

}  // namespace
}  // namespace mpsshim::testdriver::test

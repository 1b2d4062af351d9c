// Kernel launches (validated like the real driver's, run in stream order by the host body of the
// kernel table) and the occupancy calculator.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr unsigned kMaxGridX = 2147483647;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned kMaxBlockXY = 1024;
constexpr unsigned kMaxBlockZ = 64;
constexpr unsigned kWarp = 32;
constexpr std::uint64_t kPortableClusterSize = 8;
constexpr std::uint64_t kNonPortableClusterSize = 16;

struct LaunchShape {
  Dim3 grid;
  Dim3 block;
  unsigned shared;
  CUstream stream;
  Dim3 cluster{0, 0, 0};  // 0: not given
};

// The cluster dims a launch uses: the config's, else the function's required ones, else none.
Dim3 cluster_of(const Function& fn, Dim3 given) {
  if (given.x != 0) return given;
  const auto& r = fn.attributes->required_cluster;
  if (r[0] > 0 && r[1] > 0 && r[2] > 0)
    return Dim3{static_cast<unsigned>(r[0]), static_cast<unsigned>(r[1]),
                static_cast<unsigned>(r[2])};
  return Dim3{0, 0, 0};
}

CUresult check_cluster(const Function& fn, Dim3 cluster) {
  if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  const std::uint64_t limit =
      fn.attributes->non_portable_cluster != 0 ? kNonPortableClusterSize : kPortableClusterSize;
  return cluster.volume() <= limit ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CLUSTER_SIZE;
}

CUresult check_shape(const Function& fn, const LaunchShape& l) {
  const Dim3 g = l.grid;
  const Dim3 b = l.block;
  if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (b.x > kMaxBlockXY || b.y > kMaxBlockXY || b.z > kMaxBlockZ ||
      b.volume() > static_cast<std::uint64_t>(kMaxThreadsPerBlock))
    return CUDA_ERROR_INVALID_VALUE;
  if (g.x > kMaxGridX || g.y > kMaxGridYZ || g.z > kMaxGridYZ) return CUDA_ERROR_INVALID_VALUE;
  if (l.shared > static_cast<unsigned>(fn.attributes->max_dynamic_shared))
    return CUDA_ERROR_INVALID_VALUE;
  const Dim3 c = cluster_of(fn, l.cluster);
  if (c.x == 0) return CUDA_SUCCESS;
  if (CUresult r = check_cluster(fn, c); r != CUDA_SUCCESS) return r;
  if (g.x % c.x != 0 || g.y % c.y != 0 || g.z % c.z != 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  return CUDA_SUCCESS;
}

}  // namespace

// The packed argument buffer, from kernelParams (one pointer per parameter) or from `extra`.
CUresult pack_arguments(const KernelDef& def, void** params, void** extra,
                        std::vector<std::byte>& args) {
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  args.assign(def.args_size, std::byte{0});
  if (params != nullptr) {
    for (std::size_t i = 0; i < def.params.size(); ++i) {
      if (params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(args.data() + def.params[i].offset, params[i], def.params[i].size);
    }
    return CUDA_SUCCESS;
  }
  if (extra == nullptr) return def.params.empty() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  const void* buffer = nullptr;
  const std::size_t* size = nullptr;
  for (void** e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
    if (*e == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      buffer = e[1];
    } else if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      size = static_cast<const std::size_t*>(e[1]);
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (def.args_size == 0) return CUDA_SUCCESS;
  if (buffer == nullptr || size == nullptr || *size < def.args_size)
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(args.data(), buffer, def.args_size);
  return CUDA_SUCCESS;
}

std::function<void()> kernel_work(const KernelDef* def, Dim3 grid, Dim3 block,
                                  std::shared_ptr<const std::vector<std::uint16_t>> sms,
                                  std::shared_ptr<std::vector<std::byte>> args) {
  return [def, grid, block, sms = std::move(sms), args = std::move(args)] {
    const KernelContext k(grid, block, *sms, &resolve_range);
    def->run(k, args->data());
  };
}

namespace {

CUresult launch(State& s, CUfunction f, const LaunchShape& shape, void** params, void** extra) {
  std::lock_guard lock(s.mutex);
  Stream* stream = nullptr;
  if (CUresult r = resolve_stream(s, shape.stream, stream); r != CUDA_SUCCESS) return r;
  Function* fn = nullptr;
  if (CUresult r = resolve_function(s, f, stream->device, fn); r != CUDA_SUCCESS) return r;
  if (fn->module->device != stream->device) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = check_shape(*fn, shape); r != CUDA_SUCCESS) return r;
  auto args = std::make_shared<std::vector<std::byte>>();
  if (CUresult r = pack_arguments(*fn->def, params, extra, *args); r != CUDA_SUCCESS) return r;
  const KernelDef* def = fn->def;
  submit_work(s, *stream, kernel_work(def, shape.grid, shape.block, stream->sms, std::move(args)));
  return CUDA_SUCCESS;
}

// The cluster dimension among a config's attributes; {0,0,0} when absent.
CUresult config_cluster(const CUlaunchConfig& config, Dim3& cluster) {
  if (config.numAttrs > 0 && config.attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  cluster = Dim3{0, 0, 0};
  for (unsigned i = 0; i < config.numAttrs; ++i) {
    const CUlaunchAttribute& a = config.attrs[i];
    if (static_cast<unsigned>(a.id) >= CU_LAUNCH_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      cluster = Dim3{a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z};
  }
  return CUDA_SUCCESS;
}

// Resident blocks per SM: threads (in whole warps), the block limit, and shared memory (each
// block also reserves 1 KiB).
int blocks_per_sm(int block_size, std::size_t dynamic_shared, const Function& fn) {
  if (block_size > kMaxThreadsPerBlock) return 0;
  if (dynamic_shared > static_cast<std::size_t>(fn.attributes->max_dynamic_shared)) return 0;
  const int warps = (block_size + static_cast<int>(kWarp) - 1) / static_cast<int>(kWarp);
  const int by_threads = kMaxThreadsPerSm / (warps * static_cast<int>(kWarp));
  const auto by_shared = static_cast<int>(kSharedPerSm / (dynamic_shared + 1024));
  return std::min({kMaxBlocksPerSm, by_threads, by_shared});
}

}  // namespace
}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
               unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
               unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  return entry([&](State& s) {
    const LaunchShape shape{
        {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, hStream};
    return launch(s, f, shape, kernelParams, extra);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config,
                                                            CUfunction f, void** kernelParams,
                                                            void** extra) {
  return entry([&](State& s) {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    LaunchShape shape{{config->gridDimX, config->gridDimY, config->gridDimZ},
                      {config->blockDimX, config->blockDimY, config->blockDimZ},
                      config->sharedMemBytes,
                      config->hStream};
    if (CUresult r = config_cluster(*config, shape.cluster); r != CUDA_SUCCESS) return r;
    return launch(s, f, shape, kernelParams, extra);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, func, dev ? dev->ordinal : -1, fn); r != CUDA_SUCCESS)
      return r;
    if (numBlocks == nullptr || blockSize <= 0 || (flags & ~CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE))
      return CUDA_ERROR_INVALID_VALUE;
    *numBlocks = blocks_per_sm(blockSize, dynamicSMemSize, *fn);
    return CUDA_SUCCESS;
  });
}

// Clusters that fit at once on the SMs the config's stream may use; the cluster size must come
// from the config or the function (cuda.h: "else the function will return an error").
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func, const CUlaunchConfig* config) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (numClusters == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Dim3 given{};
    if (CUresult r = config_cluster(*config, given); r != CUDA_SUCCESS) return r;
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, config->hStream, stream); r != CUDA_SUCCESS) return r;
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, func, stream->device, fn); r != CUDA_SUCCESS) return r;
    const Dim3 cluster = cluster_of(*fn, given);
    if (CUresult r = check_cluster(*fn, cluster); r != CUDA_SUCCESS) return r;
    *numClusters = static_cast<int>(stream->sms->size() / cluster.volume());
    return CUDA_SUCCESS;
  });
}

// The largest cluster the function may be launched with: 8 blocks (portable), 16 once the
// function allows non-portable sizes, as on an H100 or H200; never more than the stream's SMs.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialClusterSize(
    int* clusterSize, CUfunction func, const CUlaunchConfig* config) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (clusterSize == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, config->hStream, stream); r != CUDA_SUCCESS) return r;
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, func, stream->device, fn); r != CUDA_SUCCESS) return r;
    const std::uint64_t limit =
        fn->attributes->non_portable_cluster != 0 ? kNonPortableClusterSize : kPortableClusterSize;
    *clusterSize = static_cast<int>(std::min<std::uint64_t>(limit, stream->sms->size()));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(
    size_t* dynamicSmemSize, CUfunction func, int numBlocks, int blockSize) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, func, dev ? dev->ordinal : -1, fn); r != CUDA_SUCCESS)
      return r;
    if (dynamicSmemSize == nullptr || numBlocks <= 0 || blockSize <= 0)
      return CUDA_ERROR_INVALID_VALUE;
    // Blocks that cannot be resident together by threads alone get no shared memory at all.
    if (blocks_per_sm(blockSize, 0, *fn) < numBlocks) {
      *dynamicSmemSize = 0;
      return CUDA_SUCCESS;
    }
    *dynamicSmemSize = static_cast<std::size_t>(kSharedPerBlockOptin / numBlocks);
    return CUDA_SUCCESS;
  });
}

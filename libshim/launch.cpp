// Kernel launches: one-way records built in place in the ring. The arguments are packed at
// their parameter offsets (the CU_LAUNCH_PARAM_BUFFER_POINTER layout), so the server launches
// with `extra` and needs no per-launch layout work. This is the hot path: no allocation, no
// system call unless the server sleeps, one uncontended lock.
#include <cstring>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/kernel_args.hpp"
#include "libshim/kernel_lookup.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

struct Geometry {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
};

CUresult launch(CUfunction hfunc, const Geometry& g, CUstream handle, DefaultStream mode,
                void** params, void** extra, const CUlaunchAttribute* attributes,
                unsigned attribute_count) {
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) [[unlikely]]
    return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) [[unlikely]]
    return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (ctx->session != f->ctx->session) [[unlikely]] {
    // A library's kernel launched on another GPU than the one it was first used on.
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    f = kernel_on_device(f, ctx, rc);
    if (f == nullptr) return rc;
  }
  if (attribute_count > proto::kMaxLaunchAttributes) return CUDA_ERROR_INVALID_VALUE;
  const void* buffer = nullptr;
  std::size_t args = 0;
  if (CUresult rc = argument_bytes(f, params, extra, buffer, args); rc != CUDA_SUCCESS) return rc;
  if (args > proto::kMaxArgsBytes) return CUDA_ERROR_INVALID_VALUE;

  std::size_t attribute_bytes = attribute_count * sizeof(proto::WireLaunchAttribute);
  std::byte* at = f->ctx->session->begin_record(
      proto::Op::kLaunchKernel,
      static_cast<std::uint32_t>(sizeof(proto::LaunchReq) + attribute_bytes + args));
  if (at == nullptr)
    return f->ctx->session->fault() ? f->ctx->session->fault() : CUDA_ERROR_MPS_CONNECTION_FAILED;
  proto::LaunchReq request{f->wire,
                           stream->wire,
                           {g.grid[0], g.grid[1], g.grid[2]},
                           {g.block[0], g.block[1], g.block[2]},
                           g.shared_bytes,
                           static_cast<std::uint32_t>(args),
                           attribute_count,
                           0};
  std::memcpy(at, &request, sizeof request);
  at += sizeof request;
  static_assert(sizeof(CUlaunchAttribute) == sizeof(proto::WireLaunchAttribute));
  if (attribute_bytes != 0) std::memcpy(at, attributes, attribute_bytes);
  at += attribute_bytes;
  pack_arguments(f, params, buffer, args, at);
  f->ctx->session->commit_record();
  return CUDA_SUCCESS;
}

CUresult launch_ex(const CUlaunchConfig* config, CUfunction f, void** params, void** extra,
                   DefaultStream mode) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Geometry g{{config->gridDimX, config->gridDimY, config->gridDimZ},
             {config->blockDimX, config->blockDimY, config->blockDimZ},
             config->sharedMemBytes};
  return launch(f, g, config->hStream, mode, params, extra, config->attrs, config->numAttrs);
}

CUresult cooperative(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     unsigned bz, unsigned shared, CUstream s, void** params, DefaultStream mode) {
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attribute.value.cooperative = 1;
  return launch(f, {{gx, gy, gz}, {bx, by, bz}, shared}, s, mode, params, nullptr, &attribute, 1);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz,
                                               unsigned shared, CUstream s, void** params,
                                               void** extra) {
  return launch(f, {{gx, gy, gz}, {bx, by, bz}, shared}, s, DefaultStream::kLegacy, params, extra,
                nullptr, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                    unsigned gz, unsigned bx, unsigned by,
                                                    unsigned bz, unsigned shared, CUstream s,
                                                    void** params, void** extra) {
  return launch(f, {{gx, gy, gz}, {bx, by, bz}, shared}, s, DefaultStream::kPerThread, params,
                extra, nullptr, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                                 void** params, void** extra) {
  return launch_ex(config, f, params, extra, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                                      void** params, void** extra) {
  return launch_ex(config, f, params, extra, DefaultStream::kPerThread);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                                          unsigned gz, unsigned bx, unsigned by,
                                                          unsigned bz, unsigned shared, CUstream s,
                                                          void** params) {
  return cooperative(f, gx, gy, gz, bx, by, bz, shared, s, params, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx,
                                                               unsigned gy, unsigned gz,
                                                               unsigned bx, unsigned by,
                                                               unsigned bz, unsigned shared,
                                                               CUstream s, void** params) {
  return cooperative(f, gx, gy, gz, bx, by, bz, shared, s, params, DefaultStream::kPerThread);
}

// ---- occupancy ----

namespace {

// An answer asked before, while no function's settings changed since (client.hpp).
bool remembered_occupancy(Function* f, int block_size, size_t dynamic_smem, unsigned flags,
                          std::uint64_t generation, int* blocks) {
  std::lock_guard lock(f->occupancy_mutex);
  for (const Function::OccupancyAnswer& a : f->occupancy) {
    if (a.generation == generation && a.block_size == block_size &&
        a.dynamic_smem == dynamic_smem && a.flags == flags) {
      *blocks = a.blocks;
      return true;
    }
  }
  return false;
}

void remember_occupancy(Function* f, const Function::OccupancyAnswer& answer) {
  std::lock_guard lock(f->occupancy_mutex);
  f->occupancy[f->occupancy_next] = answer;
  f->occupancy_next = (f->occupancy_next + 1) % f->occupancy.size();
}

// Answers are remembered per function: the occupancy depends only on the function, its settings
// and the arguments, not on the SMs the client was granted, and PyTorch's cuDNN asks ~30 times
// per ResNet-50 inference (3,635 round trips in a 121-inference run), each a round trip that
// waits behind every other client's work when the server is crowded.
CUresult max_active_blocks(int* blocks, CUfunction hfunc, int block_size, size_t dynamic_smem,
                           unsigned flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult here = CUDA_SUCCESS;
  if (f = function_here(f, here); f == nullptr) return here;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  if (blocks == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t generation = function_settings_generation.load(std::memory_order_acquire);
  if (remembered_occupancy(f, block_size, dynamic_smem, flags, generation, blocks)) {
    return CUDA_SUCCESS;
  }
  proto::OccupancyReq request{f->wire, block_size, flags, dynamic_smem};
  proto::OccupancyRep reply{};
  CUresult rc = f->ctx->session->call(proto::Op::kOccupancyMaxActiveBlocks, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  *blocks = static_cast<int>(reply.value);
  remember_occupancy(f, {generation, dynamic_smem, block_size, flags, *blocks});
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks,
                                                                            CUfunction f,
                                                                            int block_size,
                                                                            size_t smem) {
  return max_active_blocks(blocks, f, block_size, smem, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* blocks, CUfunction f, int block_size, size_t smem, unsigned int flags) {
  return max_active_blocks(blocks, f, block_size, smem, flags);
}

// The callback that sizes dynamic shared memory is client code: the search runs here, asking
// the server one occupancy question per candidate block size (as the real driver's search does
// internally).
MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(
    int* min_grid, int* block_size, CUfunction hfunc, CUoccupancyB2DSize smem_for_block,
    size_t dynamic_smem, int block_limit, unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult here = CUDA_SUCCESS;
  if (f = function_here(f, here); f == nullptr) return here;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  if (min_grid == nullptr || block_size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int max_threads = 0;
  if (CUresult rc =
          cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, hfunc);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (block_limit > 0) max_threads = std::min(max_threads, block_limit);
  int sms = client_sm_count(f->ctx->device);
  int best_block = 0, best_threads = 0, best_blocks = 0;
  for (int candidate = max_threads - max_threads % 32; candidate > 0; candidate -= 32) {
    size_t smem = smem_for_block ? smem_for_block(candidate) : dynamic_smem;
    int blocks = 0;
    if (CUresult rc = max_active_blocks(&blocks, hfunc, candidate, smem, flags);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    if (blocks * candidate > best_threads) {
      best_threads = blocks * candidate;
      best_block = candidate;
      best_blocks = blocks;
    }
  }
  *block_size = best_block;
  *min_grid = best_blocks * sms;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size,
                                                                 CUfunction f,
                                                                 CUoccupancyB2DSize smem_for_block,
                                                                 size_t dynamic_smem,
                                                                 int block_limit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, f, smem_for_block,
                                                   dynamic_smem, block_limit, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* smem,
                                                                        CUfunction hfunc,
                                                                        int blocks,
                                                                        int block_size) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult here = CUDA_SUCCESS;
  if (f = function_here(f, here); f == nullptr) return here;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  if (smem == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::OccupancyReq request{f->wire, block_size, static_cast<std::uint32_t>(blocks), 0};
  proto::OccupancyRep reply{};
  CUresult rc = f->ctx->session->call(proto::Op::kOccupancyAvailableDynamicSmem, request, &reply);
  if (rc == CUDA_SUCCESS) *smem = static_cast<size_t>(reply.value);
  return rc;
}

namespace {

// A cluster occupancy question (op: max active clusters or potential cluster size) about `hfunc`
// with `config`, asked of the server of the function's GPU.
CUresult cluster_question(proto::Op op, int* answer, CUfunction hfunc,
                          const CUlaunchConfig* config) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult here = CUDA_SUCCESS;
  if (f = function_here(f, here); f == nullptr) return here;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  if (answer == nullptr || config == nullptr || config->numAttrs > proto::kMaxLaunchAttributes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::ClusterOccupancyReq request{f->wire,
                                     {config->gridDimX, config->gridDimY, config->gridDimZ},
                                     {config->blockDimX, config->blockDimY, config->blockDimZ},
                                     config->sharedMemBytes,
                                     config->numAttrs};
  proto::OccupancyRep reply{};
  auto attrs = std::as_bytes(std::span<const CUlaunchAttribute>(config->attrs, config->numAttrs));
  CUresult rc = f->ctx->session->call(op, &request, sizeof request, attrs, &reply, sizeof reply);
  if (rc == CUDA_SUCCESS) *answer = static_cast<int>(reply.value);
  return rc;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* clusters, CUfunction hfunc,
                                                             const CUlaunchConfig* config) {
  return cluster_question(proto::Op::kOccupancyMaxActiveClusters, clusters, hfunc, config);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialClusterSize(int* size, CUfunction hfunc,
                                                                   const CUlaunchConfig* config) {
  return cluster_question(proto::Op::kOccupancyMaxPotentialClusterSize, size, hfunc, config);
}

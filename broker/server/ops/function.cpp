#include "broker/server/ops/launch_attributes.hpp"
#include "broker/server/ops/ops.hpp"

namespace mpsshim::server {

// The Func* and Kernel* attribute opcodes take either kind of handle: a CUfunction goes to
// cuFunc*Attribute, a CUkernel to cuKernel*Attribute for the server's device.

OpResult op_function_get_attribute(Call& call) {
  auto req = call.request<proto::AttributeReq>();
  Session& session = call.session;
  auto attribute = static_cast<CUfunction_attribute>(req.attribute);
  int value = 0;
  CUresult r;
  if (const FunctionObj* f = session.objects.get<FunctionObj>(req.handle)) {
    r = call.cu.cuFuncGetAttribute(&value, attribute, f->function);
  } else if (const KernelObj* k = session.objects.get<KernelObj>(req.handle)) {
    r = call.cu.cuKernelGetAttribute(&value, attribute, k->kernel, session.gpu().device);
  } else {
    return call.done(CUDA_ERROR_INVALID_HANDLE);
  }
  if (r != CUDA_SUCCESS) return call.done(r);
  return call.reply(proto::AttributeRep{value, 0});
}

namespace {

// Whether a function or kernel handle comes from a library other sessions may use too
// (image_cache.hpp): its attributes are then the driver's one setting for all of them.
bool from_shared_library(Session& session, std::uint64_t handle) {
  std::uint64_t library = 0;
  if (const KernelObj* k = session.objects.get<KernelObj>(handle)) {
    library = k->library;
  } else if (const FunctionObj* f = session.objects.get<FunctionObj>(handle)) {
    if (const KernelObj* owner = session.objects.get<KernelObj>(f->owner)) {
      library = owner->library;
    } else if (const ModuleObj* module = session.objects.get<ModuleObj>(f->owner)) {
      library = module->library;
    }
  }
  const LibraryObj* object = library != 0 ? session.objects.get<LibraryObj>(library) : nullptr;
  return object != nullptr && object->shared != nullptr;
}

}  // namespace

OpResult op_function_set_attribute(Call& call) {
  auto req = call.request<proto::AttributeReq>();
  Session& session = call.session;
  auto attribute = static_cast<CUfunction_attribute>(req.attribute);
  const FunctionObj* f = session.objects.get<FunctionObj>(req.handle);
  const KernelObj* k = f == nullptr ? session.objects.get<KernelObj>(req.handle) : nullptr;
  if (f == nullptr && k == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  // A shared library's dynamic shared-memory allowance only grows: a session that sets less
  // than another one did must not make the other's launches fail. (A launch over this session's
  // own setting but under another's then runs where the driver would have refused it.)
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && req.value >= 0 &&
      from_shared_library(session, req.handle)) {
    int current = 0;
    CUresult r = f != nullptr ? call.cu.cuFuncGetAttribute(&current, attribute, f->function)
                              : call.cu.cuKernelGetAttribute(&current, attribute, k->kernel,
                                                             session.gpu().device);
    if (r == CUDA_SUCCESS && req.value <= current) return call.done(CUDA_SUCCESS);
  }
  if (f != nullptr) return call.done(call.cu.cuFuncSetAttribute(f->function, attribute, req.value));
  return call.done(
      call.cu.cuKernelSetAttribute(attribute, req.value, k->kernel, session.gpu().device));
}

OpResult op_function_set_cache_config(Call& call) {
  auto req = call.request<proto::AttributeReq>();
  CUfunction function = nullptr;
  if (CUresult r = resolve_function(call, req.handle, true, &function); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.done(call.cu.cuFuncSetCacheConfig(function, static_cast<CUfunc_cache>(req.value)));
}

OpResult op_occupancy_max_active_blocks(Call& call) {
  auto req = call.request<proto::OccupancyReq>();
  CUfunction function = nullptr;
  if (CUresult r = resolve_function(call, req.function, true, &function); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  int blocks = 0;
  if (CUresult r = call.cu.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
          &blocks, function, req.block_size, req.dynamic_smem, req.flags);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::OccupancyRep{blocks});
}

namespace {

// A cluster occupancy query (kOccupancyMaxActiveClusters, kOccupancyMaxPotentialClusterSize):
// the function and launch configuration it names handed to `ask` (the driver's query), whose
// answer is the reply.
template <typename Ask>
OpResult cluster_query(Call& call, Ask ask) {
  auto req = call.request<proto::ClusterOccupancyReq>();
  if (req.attribute_count > proto::kMaxLaunchAttributes ||
      !call.exact(sizeof req,
                  std::uint64_t{req.attribute_count} * sizeof(proto::WireLaunchAttribute))) {
    return call.malformed(
        fmt::format("a cluster occupancy query states {} attributes that the "
                    "record does not hold",
                    req.attribute_count));
  }
  CUfunction function = nullptr;
  if (CUresult r = resolve_function(call, req.function, true, &function); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUlaunchAttribute attributes[proto::kMaxLaunchAttributes];
  if (CUresult r = convert_launch_attributes(
          call.session,
          call.trailing(sizeof req, req.attribute_count * sizeof(proto::WireLaunchAttribute)),
          req.attribute_count, attributes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUlaunchConfig config{};
  config.gridDimX = req.grid[0];
  config.gridDimY = req.grid[1];
  config.gridDimZ = req.grid[2];
  config.blockDimX = req.block[0];
  config.blockDimY = req.block[1];
  config.blockDimZ = req.block[2];
  config.sharedMemBytes = req.shared_bytes;
  config.hStream = nullptr;  // a query: nothing is launched
  config.attrs = attributes;
  config.numAttrs = req.attribute_count;
  int answer = 0;
  if (CUresult r = ask(&answer, function, &config); r != CUDA_SUCCESS) return call.done(r);
  return call.reply(proto::OccupancyRep{answer});
}

}  // namespace

OpResult op_occupancy_max_active_clusters(Call& call) {
  return cluster_query(call, call.cu.cuOccupancyMaxActiveClusters);
}

OpResult op_occupancy_max_potential_cluster_size(Call& call) {
  return cluster_query(call, call.cu.cuOccupancyMaxPotentialClusterSize);
}

// cuOccupancyAvailableDynamicSMemPerBlock(func, numBlocks, blockSize): numBlocks travels in
// OccupancyReq::flags.
OpResult op_occupancy_available_dynamic_smem(Call& call) {
  auto req = call.request<proto::OccupancyReq>();
  CUfunction function = nullptr;
  if (CUresult r = resolve_function(call, req.function, true, &function); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::size_t bytes = 0;
  if (CUresult r = call.cu.cuOccupancyAvailableDynamicSMemPerBlock(
          &bytes, function, static_cast<int>(req.flags), req.block_size);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::OccupancyRep{static_cast<std::int64_t>(bytes)});
}

}  // namespace mpsshim::server

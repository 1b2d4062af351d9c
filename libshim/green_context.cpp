// Green contexts a client makes itself (docs/green-contexts.md), carved out of its SM quota by
// its GPU's server (broker/server/ops/green_context.cpp). The client's device is its quota:
// cuDeviceGetDevResource answers the SMs of the green context the server runs it in, and the
// resources, splits and descriptors are the server's driver's, whose bytes come back here
// unchanged. A green context is a client context (Context) made by the server in a real green
// context of those SMs; its streams run there.
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "proto/ops_green.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

static_assert(sizeof(CUdevResource) == proto::kDevResourceBytes);

// Which device's server handed out each resource: a split or a descriptor goes back to it.
// Resources are plain bytes the program may copy, so they are known by value. Bounded as the
// server bounds what it hands one client (ClientGreen::kMaxResources).
class ResourceOrigins {
 public:
  void note(const CUdevResource& resource, int device) {
    std::lock_guard lock(mutex_);
    if (devices_.size() < kMax) devices_.emplace(key(resource), device);
  }
  // -1 when no server handed it out.
  int device_of(const CUdevResource& resource) const {
    std::lock_guard lock(mutex_);
    auto it = devices_.find(key(resource));
    return it == devices_.end() ? -1 : it->second;
  }

 private:
  static constexpr std::size_t kMax = 4096 * 16;
  static std::string key(const CUdevResource& r) {
    return std::string(reinterpret_cast<const char*>(&r), sizeof r);
  }
  mutable std::mutex mutex_;
  std::unordered_map<std::string, int> devices_;
};

ResourceOrigins& origins() {
  static auto* known = new ResourceOrigins();  // lives through exit, like the sessions
  return *known;
}

void take(const proto::DevResource& wire, CUdevResource* out, int device) {
  std::memcpy(out, wire.bytes, sizeof *out);
  origins().note(*out, device);
}

proto::DevResource wire_of(const CUdevResource& resource) {
  proto::DevResource wire{};
  std::memcpy(wire.bytes, &resource, sizeof wire.bytes);
  return wire;
}

// The SM resource of context `ctx_wire` (0: the client's quota) on `session`'s server.
CUresult ask_resource(Session* session, int device, proto::WireHandle ctx_wire,
                      CUdevResource* resource, CUdevResourceType type) {
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::GreenResourceReq request{ctx_wire, static_cast<std::uint32_t>(type), 0};
  proto::DevResource reply{};
  if (CUresult rc = session->call(proto::Op::kGreenResource, request, &reply); rc != CUDA_SUCCESS) {
    return rc;
  }
  take(reply, resource, device);
  return CUDA_SUCCESS;
}

// The session of the device whose server handed out `resource`.
CUresult origin_session(const CUdevResource& resource, int& device, Session*& session) {
  device = origins().device_of(resource);
  // The driver refuses bytes it cannot read so (tools/probes/green_nested.cu).
  if (device < 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  return session_for(device, session);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetDevResource(CUdevice dev, CUdevResource* resource,
                                                       CUdevResourceType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (dev < 0 || dev >= visible_device_count()) return CUDA_ERROR_INVALID_DEVICE;
  Session* session = nullptr;
  if (CUresult rc = session_for(dev, session); rc != CUDA_SUCCESS) return rc;
  return ask_resource(session, dev, 0, resource, type);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetDevResource(CUcontext handle, CUdevResource* resource,
                                                    CUdevResourceType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = object_of<Context>(handle);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult rc = activate(ctx); rc != CUDA_SUCCESS) return rc;
  return ask_resource(ctx->session, ctx->device, ctx->wire, resource, type);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxGetDevResource(CUgreenCtx handle, CUdevResource* resource,
                                                         CUdevResourceType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return ask_resource(green->ctx.session, green->ctx.device, green->ctx.wire, resource, type);
}

// A split longer than one answer is asked again from where the last answer ended: the server
// answers from the outputs of its one driver call.
MPSSHIM_EXPORT CUresult CUDAAPI cuDevSmResourceSplitByCount(
    CUdevResource* result, unsigned int* nbGroups, const CUdevResource* input,
    CUdevResource* remaining, unsigned int useFlags, unsigned int minCount) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (nbGroups == nullptr || input == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (result != nullptr && *nbGroups == 0) return CUDA_ERROR_INVALID_VALUE;
  int device = -1;
  Session* session = nullptr;
  if (CUresult rc = origin_session(*input, device, session); rc != CUDA_SUCCESS) return rc;
  proto::GreenSplitReq request{};
  request.input = wire_of(*input);
  request.groups = result == nullptr ? 0 : *nbGroups;
  request.min_count = minCount;
  request.flags = useFlags;
  proto::GreenSplitRep reply{};
  if (result == nullptr) {
    if (CUresult rc = session->call(proto::Op::kGreenSplit, request, &reply); rc != CUDA_SUCCESS) {
      return rc;
    }
    *nbGroups = reply.groups;
    return CUDA_SUCCESS;
  }
  do {
    if (CUresult rc = session->call(proto::Op::kGreenSplit, request, &reply); rc != CUDA_SUCCESS) {
      return rc;
    }
    for (std::uint32_t i = 0; i < reply.count; ++i) {
      take(reply.result[i], &result[request.first + i], device);
    }
    request.first += reply.count;
  } while (reply.count != 0 && request.first < reply.groups);
  if (remaining != nullptr) take(reply.remaining, remaining, device);
  *nbGroups = reply.groups;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc* phDesc,
                                                          CUdevResource* resources,
                                                          unsigned int nbResources) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (phDesc == nullptr || resources == nullptr || nbResources == 0 ||
      nbResources > proto::kGreenDescMaxResources) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int device = -1;
  Session* session = nullptr;
  if (CUresult rc = origin_session(resources[0], device, session); rc != CUDA_SUCCESS) return rc;
  for (unsigned i = 1; i < nbResources; ++i) {
    if (origins().device_of(resources[i]) != device)
      return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  }
  proto::GreenDescReq request{nbResources, 0};
  proto::GreenDescRep reply{};
  const std::span<const std::byte> trailing(reinterpret_cast<const std::byte*>(resources),
                                            sizeof(CUdevResource) * nbResources);
  if (CUresult rc = session->call(proto::Op::kGreenDesc, &request, sizeof request, trailing, &reply,
                                  sizeof reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  auto* desc = new ResourceDesc();
  desc->device = device;
  desc->session = session;
  desc->wire = reply.desc;
  *phDesc = reinterpret_cast<CUdevResourceDesc>(desc);
  return CUDA_SUCCESS;
}

// Not made current, as natively.
MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc handle,
                                                 CUdevice dev, unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (phCtx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= visible_device_count()) return CUDA_ERROR_INVALID_DEVICE;
  const ResourceDesc* desc = object_of<ResourceDesc>(handle);
  if (desc == nullptr || desc->device != dev) return CUDA_ERROR_INVALID_VALUE;
  proto::GreenCtxCreateReq request{desc->wire, flags, 0};
  proto::GreenCtxCreateRep reply{};
  if (CUresult rc = desc->session->call(proto::Op::kGreenCtxCreate, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  auto* green = new GreenContext();
  green->sm_count = reply.sm_count;
  green->ctx.device = dev;
  green->ctx.green = reinterpret_cast<CUgreenCtx>(green);
  adopt_server_context(&green->ctx, desc->session, reply.ctx, reply.default_stream);
  *phCtx = reinterpret_cast<CUgreenCtx>(green);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  destroy_context(&green->ctx);
  // Stays allocated, dead, like a destroyed context: a stale handle is refused.
  green->magic = Magic::kDead;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext* pContext, CUgreenCtx handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (pContext == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *pContext = reinterpret_cast<CUcontext>(&green->ctx);
  return CUDA_SUCCESS;
}

// Natively the same id as its CUcontext's (cuCtxGetId).
MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxGetId(CUgreenCtx handle, unsigned long long* id) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *id = green->ctx.id.load(std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

// The green context's activity: cuCtxRecordEvent / cuCtxWaitEvent of its CUcontext.
MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxRecordEvent(CUgreenCtx handle, CUevent event) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return cuCtxRecordEvent(reinterpret_cast<CUcontext>(&green->ctx), event);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGreenCtxWaitEvent(CUgreenCtx handle, CUevent event) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GreenContext* green = object_of<GreenContext>(handle);
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return cuCtxWaitEvent(reinterpret_cast<CUcontext>(&green->ctx), event);
}

// A client's own green contexts (cuDeviceGetDevResource, cuCtxGetDevResource,
// cuGreenCtxGetDevResource, cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc,
// cuGreenCtxCreate; docs/green-contexts.md), carved out of the green context of its SM quota.
//
// The client sees its quota as its device: the SM resource it is handed is its green
// context's, which the real driver lets a process split again (tools/probes/green_nested.cu:
// on an H200 a green context of 64 SMs split into groups of 16, and kernels of a group's green
// context ran on 16 of the 64). What it splits and combines are bytes the server handed it
// (client_green.hpp). A green context it creates is a client context like cuCtxCreate's, whose
// streams are made in the real green context; cuGreenCtxDestroy is cuCtxDestroy of it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "broker/server/ops/ops.hpp"
#include "broker/server/scheduling/green_context.hpp"
#include "broker/server/session/limit_check.hpp"
#include "proto/ops_green.hpp"

namespace mpsshim::server {
namespace {

static_assert(sizeof(CUdevResource) == proto::kDevResourceBytes);

proto::DevResource wire_of(const CUdevResource& resource) {
  proto::DevResource out{};
  std::memcpy(out.bytes, &resource, sizeof out.bytes);
  return out;
}

CUdevResource resource_of(const proto::DevResource& wire) {
  CUdevResource out{};
  std::memcpy(&out, wire.bytes, sizeof out);
  return out;
}

// The client handed back a resource it was not given: refused as the driver refuses one it
// cannot read, and noted once.
OpResult refuse_resource(Call& call) {
  note_not_owned(call, "an SM resource");
  return call.done(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
}

}  // namespace

OpResult op_green_resource(Call& call) {
  auto req = call.request<proto::GreenResourceReq>();
  Session& session = call.session;
  CUgreenCtx green = session.green.green;
  // A green context of the client's made before a live SM quota change keeps the old quota's
  // SMs: its resource is answered, but not handed out to be split or combined again.
  bool may_split = true;
  if (req.ctx != 0) {
    const ContextObj* ctx = session.objects.get<ContextObj>(req.ctx);
    if (ctx == nullptr) return call.done(CUDA_ERROR_INVALID_CONTEXT);
    if (ctx->green != nullptr) {
      green = ctx->green;
      may_split = ctx->green_generation == session.quota_changes.generation;
    }
  }
  if (req.type != CU_DEV_RESOURCE_TYPE_SM) return call.done(CUDA_ERROR_INVALID_RESOURCE_TYPE);
  if (green == nullptr) return call.done(CUDA_ERROR_NOT_SUPPORTED);
  CUdevResource resource{};
  if (CUresult r = call.cu.cuGreenCtxGetDevResource(green, &resource, CU_DEV_RESOURCE_TYPE_SM);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (may_split && !session.client_green.issue(resource)) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(wire_of(resource));
}

OpResult op_green_split(Call& call) {
  auto req = call.request<proto::GreenSplitReq>();
  ClientGreen& green = call.session.client_green;
  const CUdevResource input = resource_of(req.input);
  if (!green.issued(input)) return refuse_resource(call);
  // More groups than SMs can never be made; the answer says how many were.
  const unsigned asked = std::min<unsigned>(req.groups, 1024);
  if (asked == 0 && req.first != 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  proto::GreenSplitRep rep{};
  const ClientGreen::Split* split =
      req.first == 0 ? nullptr : green.kept_split(input, asked, req.min_count, req.flags);
  if (req.first != 0 && split == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (split == nullptr) {
    ClientGreen::Split made;
    made.input = ClientGreen::key(input);
    made.groups = asked;
    made.min_count = req.min_count;
    made.flags = req.flags;
    made.outputs.resize(asked);
    unsigned count = asked;
    CUresult r = CUDA_SUCCESS;
    {
      // The driver fails a split made while another thread of the process splits.
      auto builds = hold_green_builds();
      r = call.cu.cuDevSmResourceSplitByCount(asked == 0 ? nullptr : made.outputs.data(), &count,
                                              &input, asked == 0 ? nullptr : &made.remaining,
                                              req.flags, req.min_count);
    }
    if (r != CUDA_SUCCESS) return call.done(r);
    if (asked == 0) {  // only counted
      rep.groups = count;
      return call.reply(rep);
    }
    made.outputs.resize(count);
    for (const CUdevResource& output : made.outputs) {
      if (!green.issue(output)) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if (!green.issue(made.remaining)) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
    green.keep_split(std::move(made));
    split = green.kept_split(input, asked, req.min_count, req.flags);
  }
  rep.groups = static_cast<std::uint32_t>(split->outputs.size());
  rep.remaining = wire_of(split->remaining);
  for (std::size_t i = req.first; i < split->outputs.size() && rep.count < proto::kGreenSplitPage;
       ++i) {
    rep.result[rep.count++] = wire_of(split->outputs[i]);
  }
  return call.reply(rep);
}

OpResult op_green_desc(Call& call) {
  auto req = call.request<proto::GreenDescReq>();
  Session& session = call.session;
  if (req.count == 0 || req.count > proto::kGreenDescMaxResources) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const std::uint64_t bytes = std::uint64_t{req.count} * proto::kDevResourceBytes;
  if (!call.exact(sizeof req, bytes)) return call.malformed("green descriptor length");
  std::vector<CUdevResource> resources(req.count);
  std::memcpy(resources.data(), call.trailing(sizeof req, bytes).data(), bytes);
  for (const CUdevResource& resource : resources) {
    if (!session.client_green.issued(resource)) return refuse_resource(call);
  }
  CUdevResourceDesc desc = nullptr;
  if (CUresult r = call.cu.cuDevResourceGenerateDesc(&desc, resources.data(), req.count);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  const std::uint64_t id = session.client_green.add_desc(desc);
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return call.reply(proto::GreenDescRep{id});
}

OpResult op_green_ctx_create(Call& call) {
  auto req = call.request<proto::GreenCtxCreateReq>();
  Session& session = call.session;
  const CUdevResourceDesc desc = session.client_green.desc(req.desc);
  if (desc == nullptr || req.flags != CU_GREEN_CTX_DEFAULT_STREAM) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (!within_client_limit(session, ClientLimit::kStreams)) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  const DriverTable& cu = call.cu;
  CUgreenCtx green = nullptr;
  {
    auto builds = hold_green_builds();
    if (CUresult r = cu.cuGreenCtxCreate(&green, desc, session.gpu().device, req.flags);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
  }
  CUdevResource sms{};
  CUstream stream = nullptr;
  const int priority = effective_priority(session, 0);
  CUresult r = cu.cuGreenCtxGetDevResource(green, &sms, CU_DEV_RESOURCE_TYPE_SM);
  if (r == CUDA_SUCCESS) {
    r = cu.cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, priority);
  }
  if (r != CUDA_SUCCESS) {
    cu.cuGreenCtxDestroy(green);
    return call.done(r);
  }
  ContextObj context;
  context.green = green;
  context.green_generation = session.quota_changes.generation;
  const std::uint64_t ctx_id = session.objects.insert(std::move(context));
  StreamObj default_stream;
  default_stream.stream = stream;
  default_stream.ctx = ctx_id;
  default_stream.is_default = true;
  default_stream.priority = priority;
  default_stream.in_client_green = true;
  const std::uint64_t stream_id = ctx_id == 0 ? 0 : session.objects.insert(default_stream);
  if (stream_id == 0) {
    cu.cuStreamDestroy_v2(stream);
    if (ctx_id != 0) session.objects.take<ContextObj>(ctx_id);
    cu.cuGreenCtxDestroy(green);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  session.objects.get<ContextObj>(ctx_id)->default_stream = stream_id;
  return call.reply(proto::GreenCtxCreateRep{ctx_id, stream_id, sms.sm.smCount, 0});
}

}  // namespace mpsshim::server

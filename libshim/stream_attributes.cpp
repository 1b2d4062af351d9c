// cuStreamGetAttribute, cuStreamSetAttribute and cuStreamCopyAttributes (docs/cuda-runtime.md,
// "Streams"). The priority is the one the stream was created with, answered here (the server's
// stream carries the client's priority with the server's bias, and changing it would move the
// client in the server's priority scheduling: a set is refused). The synchronization policy is
// kept here: it tells how a host thread waits, and the client's threads wait by the shim's own
// policy. The access policy window and the memory synchronization domain and its map are the
// server's driver's (one round trip each, broker/server/ops/stream_attributes.cpp).
#include <cstring>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "proto/ops_stream_attributes.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

static_assert(sizeof(CUstreamAttrValue) == sizeof(proto::WireLaunchAttribute::value));

CUresult get(CUstream handle, CUstreamAttrID id, CUstreamAttrValue* value, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (id == CU_STREAM_ATTRIBUTE_PRIORITY) {
    *value = CUstreamAttrValue{};
    value->priority = stream->priority;
    return CUDA_SUCCESS;
  }
  if (id == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
    *value = CUstreamAttrValue{};
    const unsigned policy =
        stream->sync_policy != 0 ? stream->sync_policy : unsigned{CU_SYNC_POLICY_AUTO};
    value->syncPolicy = static_cast<CUsynchronizationPolicy>(policy);
    return CUDA_SUCCESS;
  }
  proto::StreamAttributeReq request{
      stream->wire, 0, static_cast<std::uint32_t>(proto::StreamAttributeMode::kGet), 0,
      proto::WireLaunchAttribute{static_cast<std::uint32_t>(id), 0, {}}};
  proto::WireLaunchAttribute reply{};
  if (CUresult rc = ctx->session->call(proto::Op::kStreamAttribute, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  std::memcpy(value, reply.value, sizeof *value);
  return CUDA_SUCCESS;
}

CUresult set(CUstream handle, CUstreamAttrID id, const CUstreamAttrValue* value,
             DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (id == CU_STREAM_ATTRIBUTE_PRIORITY) {
    log_once("cuStreamSetAttribute.priority", LogLevel::kWarn,
             "cuStreamSetAttribute: changing a stream's priority is not supported by mpsshim "
             "(the server schedules clients by their streams' priorities); create the stream "
             "with cuStreamCreateWithPriority");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (id == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
    const unsigned policy = value->syncPolicy;
    if (policy < CU_SYNC_POLICY_AUTO || policy > CU_SYNC_POLICY_BLOCKING_SYNC) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    stream->sync_policy = policy;
    return CUDA_SUCCESS;
  }
  proto::StreamAttributeReq request{
      stream->wire, 0, static_cast<std::uint32_t>(proto::StreamAttributeMode::kSet), 0,
      proto::WireLaunchAttribute{static_cast<std::uint32_t>(id), 0, {}}};
  std::memcpy(request.attribute.value, value, sizeof *value);
  return ctx->session->call(proto::Op::kStreamAttribute, request, static_cast<int*>(nullptr));
}

CUresult copy(CUstream dst, CUstream src, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* to = nullptr;
  Context* src_ctx = nullptr;
  Stream* from = nullptr;
  if (CUresult rc = resolve_stream(dst, mode, ctx, to); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = resolve_stream(src, mode, src_ctx, from); rc != CUDA_SUCCESS) return rc;
  if (src_ctx->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;  // another GPU's
  proto::StreamAttributeReq request{to->wire, from->wire,
                                    static_cast<std::uint32_t>(proto::StreamAttributeMode::kCopy),
                                    0, proto::WireLaunchAttribute{}};
  CUresult rc =
      ctx->session->call(proto::Op::kStreamAttribute, request, static_cast<int*>(nullptr));
  if (rc == CUDA_SUCCESS) to->sync_policy = from->sync_policy;
  return rc;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetAttribute(CUstream h, CUstreamAttrID id,
                                                     CUstreamAttrValue* value) {
  return get(h, id, value, DefaultStream::kLegacy);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetAttribute_ptsz(CUstream h, CUstreamAttrID id,
                                                          CUstreamAttrValue* value) {
  return get(h, id, value, DefaultStream::kPerThread);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuStreamSetAttribute(CUstream h, CUstreamAttrID id,
                                                     const CUstreamAttrValue* value) {
  return set(h, id, value, DefaultStream::kLegacy);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuStreamSetAttribute_ptsz(CUstream h, CUstreamAttrID id,
                                                          const CUstreamAttrValue* value) {
  return set(h, id, value, DefaultStream::kPerThread);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuStreamCopyAttributes(CUstream dst, CUstream src) {
  return copy(dst, src, DefaultStream::kLegacy);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuStreamCopyAttributes_ptsz(CUstream dst, CUstream src) {
  return copy(dst, src, DefaultStream::kPerThread);
}

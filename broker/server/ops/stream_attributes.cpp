// cuStreamGetAttribute, cuStreamSetAttribute and cuStreamCopyAttributes on a client's streams
// (docs/cuda-runtime.md, "Streams"). The server's driver keeps the attributes that reach the GPU:
// an access policy window (which must lie in the client's memory, as for a launch) and the
// memory synchronization domain and its map. The shim keeps the priority and the
// synchronization policy itself and never sends them; a set of anything else is refused.
#include <cstring>

#include "broker/server/ops/launch_attributes.hpp"
#include "broker/server/ops/ops.hpp"
#include "proto/ops_stream_attributes.hpp"

namespace mpsshim::server {
namespace {

bool server_attribute(std::uint32_t id) {
  return id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW ||
         id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN || id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP;
}

}  // namespace

OpResult op_stream_attribute(Call& call) {
  auto req = call.request<proto::StreamAttributeReq>();
  CUresult error = CUDA_SUCCESS;
  const auto mode = static_cast<proto::StreamAttributeMode>(req.mode);
  StreamObj* stream =
      use_stream(call, req.stream, mode != proto::StreamAttributeMode::kGet, &error);
  if (stream == nullptr) return call.done(error);
  switch (mode) {
    case proto::StreamAttributeMode::kGet: {
      if (!server_attribute(req.attribute.id)) return call.done(CUDA_ERROR_INVALID_VALUE);
      CUstreamAttrValue value{};
      if (CUresult r = call.cu.cuStreamGetAttribute(
              stream->stream, static_cast<CUstreamAttrID>(req.attribute.id), &value);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
      return call.reply(wire_attribute(req.attribute.id, value));
    }
    case proto::StreamAttributeMode::kSet: {
      if (!server_attribute(req.attribute.id)) return call.done(CUDA_ERROR_INVALID_VALUE);
      CUlaunchAttribute checked{};
      if (CUresult r = convert_launch_attributes(
              call.session, std::as_bytes(std::span(&req.attribute, 1)), 1, &checked);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
      return call.done(call.cu.cuStreamSetAttribute(
          stream->stream, static_cast<CUstreamAttrID>(checked.id), &checked.value));
    }
    case proto::StreamAttributeMode::kCopy: {
      StreamObj* source = use_stream(call, req.source, false, &error);
      if (source == nullptr) return call.done(error);
      return call.done(call.cu.cuStreamCopyAttributes(stream->stream, source->stream));
    }
  }
  return call.done(CUDA_ERROR_INVALID_VALUE);
}

}  // namespace mpsshim::server

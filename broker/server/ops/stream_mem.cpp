// Stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64 and the operations
// of cuStreamBatchMemOp; docs/cuda-runtime.md): one record each, issued in the client's stream
// order on its own stream. NCCL's copy-engine collectives and expert-parallel libraries wait
// on and write flags so. The address must be memory the client holds (its own, opened, a peer
// GPU's it mapped, or pinned host memory); the driver checks the flags.
#include "broker/server/ops/ops.hpp"
#include "proto/ops_stream_mem.hpp"

namespace mpsshim::server {
namespace {

CUresult issue(const DriverTable& cu, CUstream stream, const proto::StreamMemOpReq& req) {
  const CUdeviceptr at = req.address;
  switch (static_cast<proto::StreamMemOpKind>(req.kind)) {
    case proto::StreamMemOpKind::kWait32:
      return cu.cuStreamWaitValue32_v2(stream, at, static_cast<cuuint32_t>(req.value), req.flags);
    case proto::StreamMemOpKind::kWait64:
      return cu.cuStreamWaitValue64_v2(stream, at, req.value, req.flags);
    case proto::StreamMemOpKind::kWrite32:
      return cu.cuStreamWriteValue32_v2(stream, at, static_cast<cuuint32_t>(req.value), req.flags);
    case proto::StreamMemOpKind::kWrite64:
      return cu.cuStreamWriteValue64_v2(stream, at, req.value, req.flags);
    case proto::StreamMemOpKind::kFlushRemoteWrites: {
      CUstreamBatchMemOpParams op{};
      op.flushRemoteWrites.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
      op.flushRemoteWrites.flags = req.flags;
      return cu.cuStreamBatchMemOp_v2(stream, 1, &op, 0);
    }
    case proto::StreamMemOpKind::kBarrier: {
      CUstreamBatchMemOpParams op{};
      op.memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
      op.memoryBarrier.flags = req.flags;
      return cu.cuStreamBatchMemOp_v2(stream, 1, &op, 0);
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

OpResult op_stream_mem_op(Call& call) {
  auto req = call.request<proto::StreamMemOpReq>();
  const auto known = proto::stream_mem_op_width(static_cast<proto::StreamMemOpKind>(req.kind));
  if (!known) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t width = *known;
  if (width != 0 && (req.address % width != 0 || !owns_memory(call, req.address, width))) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  return finish_on_stream(call, *stream, issue(call.cu, stream->stream, req));
}

}  // namespace mpsshim::server

// Stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64 and the operations
// of cuStreamBatchMemOp; docs/cuda-runtime.md): one record each, issued in the client's stream
// order on its own stream. NCCL's copy-engine collectives and expert-parallel libraries wait
// on and write flags so. The address must be memory the client holds (its own, opened, a peer
// GPU's it mapped, or pinned host memory); the driver checks the flags.
#include "broker/server/ops/ops.hpp"
#include "broker/server/ops/stream_mem_op.hpp"
#include "proto/ops_stream_mem.hpp"

namespace mpsshim::server {
namespace {

// The waits and writes by their own entry points; a flush or a barrier as a batch of one.
CUresult issue(const DriverTable& cu, CUstream stream, const proto::StreamMemOpReq& req,
               CUstreamBatchMemOpParams op) {
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
    default:
      return cu.cuStreamBatchMemOp_v2(stream, 1, &op, 0);
  }
}

}  // namespace

std::optional<CUstreamBatchMemOpParams> driver_mem_op(Call& call, const proto::StreamMemOpReq& op) {
  const auto kind = static_cast<proto::StreamMemOpKind>(op.kind);
  const auto width = proto::stream_mem_op_width(kind);
  if (!width) return std::nullopt;
  if (*width != 0 && (op.address % *width != 0 || !owns_memory(call, op.address, *width))) {
    return std::nullopt;
  }
  CUstreamBatchMemOpParams p{};
  switch (kind) {
    case proto::StreamMemOpKind::kWait32:
    case proto::StreamMemOpKind::kWait64:
      p.waitValue.operation = kind == proto::StreamMemOpKind::kWait32
                                  ? CU_STREAM_MEM_OP_WAIT_VALUE_32
                                  : CU_STREAM_MEM_OP_WAIT_VALUE_64;
      p.waitValue.address = op.address;
      p.waitValue.value64 = op.value;
      p.waitValue.flags = op.flags;
      break;
    case proto::StreamMemOpKind::kWrite32:
    case proto::StreamMemOpKind::kWrite64:
      p.writeValue.operation = kind == proto::StreamMemOpKind::kWrite32
                                   ? CU_STREAM_MEM_OP_WRITE_VALUE_32
                                   : CU_STREAM_MEM_OP_WRITE_VALUE_64;
      p.writeValue.address = op.address;
      p.writeValue.value64 = op.value;
      p.writeValue.flags = op.flags;
      break;
    case proto::StreamMemOpKind::kFlushRemoteWrites:
      p.flushRemoteWrites.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
      p.flushRemoteWrites.flags = op.flags;
      break;
    case proto::StreamMemOpKind::kBarrier:
      p.memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
      p.memoryBarrier.flags = op.flags;
      break;
  }
  return p;
}

OpResult op_stream_mem_op(Call& call) {
  auto req = call.request<proto::StreamMemOpReq>();
  const auto op = driver_mem_op(call, req);
  if (!op) return call.done(CUDA_ERROR_INVALID_VALUE);
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  return finish_on_stream(call, *stream, issue(call.cu, stream->stream, req, *op));
}

}  // namespace mpsshim::server

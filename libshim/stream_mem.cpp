// Stream memory operations: cuStreamWaitValue32/64, cuStreamWriteValue32/64 and
// cuStreamBatchMemOp (docs/cuda-runtime.md). Each operation is one record on the stream's
// server, issued there in stream order (broker/server/ops/stream_mem.cpp). Like a memset, it is
// posted: the address is checked here first (the client's own device memory, memory another GPU
// of the process owns, mapped into this GPU's server first, or pinned host memory), so a wrong
// one is refused at once, as by the driver.
#include "libshim/stream_mem.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/peer.hpp"
#include "proto/ops_stream_mem.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

// Whether the flags are ones the driver takes for the operation (cuda.h).
bool valid_flags(proto::StreamMemOpKind kind, unsigned flags) {
  switch (kind) {
    case proto::StreamMemOpKind::kWait32:
    case proto::StreamMemOpKind::kWait64:
      return (flags & ~(0x3u | unsigned{CU_STREAM_WAIT_VALUE_FLUSH})) == 0;
    case proto::StreamMemOpKind::kWrite32:
    case proto::StreamMemOpKind::kWrite64:
      return (flags & ~unsigned{CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER}) == 0;
    case proto::StreamMemOpKind::kFlushRemoteWrites:
      return flags == 0;
    case proto::StreamMemOpKind::kBarrier:
      return flags == CU_STREAM_MEMORY_BARRIER_TYPE_SYS ||
             flags == CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
  }
  return false;
}

CUresult post_op(Context* ctx, Stream* stream, proto::StreamMemOpKind kind, CUdeviceptr address,
                 std::uint64_t value, unsigned flags) {
  proto::StreamMemOpReq request{};
  if (CUresult rc = wire_mem_op(ctx, kind, address, value, flags, request); rc != CUDA_SUCCESS) {
    return rc;
  }
  request.stream = stream->wire;
  return ctx->session->post(proto::Op::kStreamMemOp, request);
}

CUresult one_op(CUstream handle, DefaultStream mode, proto::StreamMemOpKind kind,
                CUdeviceptr address, std::uint64_t value, unsigned flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  return post_op(ctx, stream, kind, address, value, flags);
}

// The operations of a batch, in order: the same as issuing them one after the other on the
// stream, which is what the batch means.
CUresult batch(CUstream handle, DefaultStream mode, unsigned count,
               const CUstreamBatchMemOpParams* ops, unsigned flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (count == 0 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  for (unsigned i = 0; i < count; ++i) {
    proto::StreamMemOpReq request{};
    if (CUresult rc = wire_mem_op(ctx, ops[i], request); rc != CUDA_SUCCESS) return rc;
    request.stream = stream->wire;
    if (CUresult rc = ctx->session->post(proto::Op::kStreamMemOp, request); rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  return CUDA_SUCCESS;
}

constexpr auto kLegacy = DefaultStream::kLegacy;
constexpr auto kPerThread = DefaultStream::kPerThread;

}  // namespace

namespace mpsshim::shim {

CUresult wire_mem_op(Context* ctx, proto::StreamMemOpKind kind, CUdeviceptr address,
                     std::uint64_t value, unsigned flags, proto::StreamMemOpReq& out) {
  if (!valid_flags(kind, flags)) return CUDA_ERROR_INVALID_VALUE;
  if (const std::uint64_t width = proto::stream_mem_op_width(kind).value_or(0); width != 0) {
    if (address % width != 0) return CUDA_ERROR_INVALID_VALUE;
    DeviceRange range{};
    PinnedRange pinned{};
    const bool known = address_book().find_device(address, &range) ||
                       address_book().find_pinned_by_device(address, &pinned) ||
                       address_book().find_pinned(reinterpret_cast<const void*>(address), &pinned);
    if (!known) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = reach_from(ctx->device, address, width); rc != CUDA_SUCCESS) return rc;
  }
  out = proto::StreamMemOpReq{0, address, value, static_cast<std::uint32_t>(kind), flags};
  return CUDA_SUCCESS;
}

CUresult wire_mem_op(Context* ctx, const CUstreamBatchMemOpParams& op, proto::StreamMemOpReq& out) {
  using K = proto::StreamMemOpKind;
  switch (op.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      return wire_mem_op(ctx, K::kWait32, op.waitValue.address, op.waitValue.value,
                         op.waitValue.flags, out);
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      return wire_mem_op(ctx, K::kWait64, op.waitValue.address, op.waitValue.value64,
                         op.waitValue.flags, out);
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      return wire_mem_op(ctx, K::kWrite32, op.writeValue.address, op.writeValue.value,
                         op.writeValue.flags, out);
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      return wire_mem_op(ctx, K::kWrite64, op.writeValue.address, op.writeValue.value64,
                         op.writeValue.flags, out);
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
      return wire_mem_op(ctx, K::kFlushRemoteWrites, 0, 0, op.flushRemoteWrites.flags, out);
    case CU_STREAM_MEM_OP_BARRIER:
      return wire_mem_op(ctx, K::kBarrier, 0, 0, op.memoryBarrier.flags, out);
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace mpsshim::shim

// The _v2 entry points and the CUDA 11 ones (the same arguments) alike; _ptsz: the thread's
// default stream for a NULL stream.
#define MPSSHIM_STREAM_MEM_ENTRIES(NAME, SUFFIX, MODE)                                     \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamWaitValue32##NAME##SUFFIX(                       \
      CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {                \
    return one_op(s, MODE, proto::StreamMemOpKind::kWait32, addr, value, flags);           \
  }                                                                                        \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamWaitValue64##NAME##SUFFIX(                       \
      CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {                \
    return one_op(s, MODE, proto::StreamMemOpKind::kWait64, addr, value, flags);           \
  }                                                                                        \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamWriteValue32##NAME##SUFFIX(                      \
      CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {                \
    return one_op(s, MODE, proto::StreamMemOpKind::kWrite32, addr, value, flags);          \
  }                                                                                        \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamWriteValue64##NAME##SUFFIX(                      \
      CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {                \
    return one_op(s, MODE, proto::StreamMemOpKind::kWrite64, addr, value, flags);          \
  }                                                                                        \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamBatchMemOp##NAME##SUFFIX(                        \
      CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops, unsigned int flags) { \
    return batch(s, MODE, count, ops, flags);                                              \
  }

MPSSHIM_STREAM_MEM_ENTRIES(, , kLegacy)
MPSSHIM_STREAM_MEM_ENTRIES(, _ptsz, kPerThread)
MPSSHIM_STREAM_MEM_ENTRIES(_v2, , kLegacy)
MPSSHIM_STREAM_MEM_ENTRIES(_v2, _ptsz, kPerThread)
#undef MPSSHIM_STREAM_MEM_ENTRIES

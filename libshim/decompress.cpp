// cuMemBatchDecompressAsync: the copy engines' decompression of Blackwell-class GPUs, in the
// stream's order on the server (broker/server/ops/decompress.cpp). A GPU without the engine
// (CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK 0, an H200) is answered here as its driver
// answers: CUDA_ERROR_NOT_SUPPORTED before any argument is looked at, errorIndex left as it was
// (tools/probes/decompress_answer.cpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "proto/ops_driver_extras.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

CUresult decompress(CUmemDecompressParams* params, size_t count, unsigned flags,
                    size_t* error_index, CUstream handle, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  const CUresult resolved = resolve_stream(handle, mode, ctx, stream);
  // Which GPU: the stream's, or where it names none, the current context's.
  Context* on = resolved == CUDA_SUCCESS ? ctx : nullptr;
  if (on == nullptr && current(on) != CUDA_SUCCESS) return resolved;
  int algorithms = 0;
  if (CUresult rc = cuDeviceGetAttribute(
          &algorithms, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, on->device);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (algorithms == 0) return CUDA_ERROR_NOT_SUPPORTED;  // before any argument, as natively
  if (resolved != CUDA_SUCCESS) return resolved;
  if (params == nullptr || count == 0) {
    if (error_index != nullptr) *error_index = std::numeric_limits<size_t>::max();
    return CUDA_ERROR_INVALID_VALUE;
  }
  // In parts of at most kDecompressMaxOperations, in order on the stream; an error in a later
  // part leaves the earlier parts queued.
  for (size_t first = 0; first < count; first += proto::kDecompressMaxOperations) {
    const size_t n = std::min<size_t>(count - first, proto::kDecompressMaxOperations);
    std::vector<proto::WireDecompressParams> wire(n);
    for (size_t i = 0; i < n; ++i) {
      const CUmemDecompressParams& p = params[first + i];
      wire[i] = proto::WireDecompressParams{p.srcNumBytes,
                                            p.dstNumBytes,
                                            reinterpret_cast<std::uint64_t>(p.dstActBytes),
                                            reinterpret_cast<std::uint64_t>(p.src),
                                            reinterpret_cast<std::uint64_t>(p.dst),
                                            static_cast<std::uint32_t>(p.algo),
                                            0};
    }
    proto::MemDecompressReq request{stream->wire, static_cast<std::uint32_t>(n), flags};
    proto::MemDecompressRep reply{proto::kDecompressIndexUnset};
    const auto trailing = std::as_bytes(std::span(wire));
    CUresult rc = ctx->session->call(proto::Op::kMemDecompress, &request, sizeof request, trailing,
                                     &reply, sizeof reply);
    if (rc == CUDA_SUCCESS) continue;
    if (error_index != nullptr && reply.error_index != proto::kDecompressIndexUnset) {
      *error_index = reply.error_index == proto::kDecompressNotAboutOne
                         ? std::numeric_limits<size_t>::max()
                         : first + static_cast<size_t>(reply.error_index);
    }
    return rc;
  }
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemBatchDecompressAsync(CUmemDecompressParams* params,
                                                          size_t count, unsigned int flags,
                                                          size_t* errorIndex, CUstream stream) {
  return decompress(params, count, flags, errorIndex, stream, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemBatchDecompressAsync_ptsz(CUmemDecompressParams* params,
                                                               size_t count, unsigned int flags,
                                                               size_t* errorIndex,
                                                               CUstream stream) {
  return decompress(params, count, flags, errorIndex, stream, DefaultStream::kPerThread);
}

// cuMemBatchDecompressAsync (proto/ops_driver_extras.hpp): the copy engines' decompression of
// Blackwell-class GPUs, in the client's stream order on its own stream. Every operation's
// source, destination and 32-bit result word must be memory the client holds; the driver checks
// the rest (alignment, the algorithm, what the GPU can do: an H200 has no decompression engine,
// tools/probes/decompress_answer.cpp) and names the operation its error is about.
#include <cstring>
#include <limits>
#include <vector>

#include "broker/server/ops/ops.hpp"
#include "proto/ops_driver_extras.hpp"

namespace mpsshim::server {
namespace {

constexpr std::uint64_t kNotAboutOne = proto::kDecompressNotAboutOne;

// An error and the operation it is about (the driver's errorIndex; kNotAboutOne: none).
OpResult failed(Call& call, CUresult error, std::uint64_t index) {
  OpResult result = call.reply(proto::MemDecompressRep{index});
  result.status = error;
  return result;
}

}  // namespace

OpResult op_mem_decompress(Call& call) {
  auto req = call.request<proto::MemDecompressReq>();
  if (req.count == 0 || req.count > proto::kDecompressMaxOperations) {
    return failed(call, CUDA_ERROR_INVALID_VALUE, kNotAboutOne);
  }
  const std::uint64_t bytes = std::uint64_t{req.count} * sizeof(proto::WireDecompressParams);
  if (!call.exact(sizeof req, bytes)) return call.malformed("decompression list length");
  std::vector<proto::WireDecompressParams> wire(req.count);
  std::memcpy(wire.data(), call.trailing(sizeof req, bytes).data(), bytes);
  std::vector<CUmemDecompressParams> params(req.count);
  for (std::uint32_t i = 0; i < req.count; ++i) {
    const proto::WireDecompressParams& w = wire[i];
    if (!owns_memory(call, w.src, w.src_bytes) || !owns_memory(call, w.dst, w.dst_bytes) ||
        !owns_memory(call, w.dst_act_bytes, sizeof(cuuint32_t))) {
      note_not_owned(call, "memory of a decompression");
      return failed(call, CUDA_ERROR_INVALID_VALUE, i);
    }
    CUmemDecompressParams& p = params[i];
    p = CUmemDecompressParams{};
    p.srcNumBytes = w.src_bytes;
    p.dstNumBytes = w.dst_bytes;
    p.dstActBytes = reinterpret_cast<cuuint32_t*>(w.dst_act_bytes);
    p.src = reinterpret_cast<const void*>(w.src);
    p.dst = reinterpret_cast<void*>(w.dst);
    p.algo = static_cast<CUmemDecompressAlgorithm>(w.algo);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return failed(call, error, kNotAboutOne);
  // Set only where the driver sets it.
  constexpr std::size_t kUnset = std::numeric_limits<std::size_t>::max() - 1;
  std::size_t index = kUnset;
  CUresult r = call.cu.cuMemBatchDecompressAsync(params.data(), params.size(), req.flags, &index,
                                                 stream->stream);
  OpResult result = finish_on_stream(call, *stream, r);
  if (result.kind == OpResult::Kind::kDone && r != CUDA_SUCCESS) {
    return failed(call, r,
                  index == kUnset                                    ? proto::kDecompressIndexUnset
                  : index == std::numeric_limits<std::size_t>::max() ? kNotAboutOne
                                                                     : index);
  }
  return result;
}

}  // namespace mpsshim::server

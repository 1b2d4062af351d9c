// Copies and memsets. Pinned host memory (ours) is addressed in place: zero-copy DMA by the
// server. Pageable memory is staged through the session's chunks, pipelined: the client fills
// chunk k+1 while the DMA of chunk k runs. Semantics follow CUDA's "API synchronization
// behavior": pageable HtoD returns once staged; DtoH to pageable returns once complete; pinned
// synchronous copies wait for completion; DtoD and memsets are asynchronous to the host.
#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/capture.hpp"
#include "libshim/client.hpp"
#include "libshim/copy_pool.hpp"
#include "libshim/peer.hpp"
#include "libshim/staging_copy.hpp"
#include "libshim/sync_memops.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

// Registers pinned memory that another GPU's server holds with `session` too (its memfd, at
// the same address: that server maps it in the other server's slice of the pinned window).
// 0 when it cannot; the copy is then staged.
proto::WireHandle register_elsewhere(Session* session, const PinnedRange& range) {
  static std::mutex registering;  // one at a time: a range is registered once per session
  std::lock_guard lock(registering);
  PinnedRange now{};
  if (!address_book().find_pinned(range.base, &now) || now.base != range.base) return 0;
  for (const PinnedRange::Elsewhere& slot : now.elsewhere) {
    if (slot.session == session) return slot.region;
  }
  std::uint32_t token = 0;
  if (session->send_fd(proto::MessageKind::kHostMemory, now.memfd, now.bytes, token) !=
      CUDA_SUCCESS) {
    return 0;
  }
  proto::HostRegisterReq request{reinterpret_cast<std::uint64_t>(now.base), now.bytes, token,
                                 now.flags};
  proto::HostRegisterRep reply{};
  if (session->call(proto::Op::kHostRegister, request, &reply) != CUDA_SUCCESS) return 0;
  if (!address_book().add_pinned_elsewhere(now.base, session, reply.region)) {
    session->post(proto::Op::kHostUnregister, proto::HostUnregisterReq{reply.region});
    return 0;
  }
  return reply.region;
}

// The pinned range holding [p, p + n), as `session` names it: its own region, or the region of
// the same memory registered there too (once, on the first copy it serves).
bool pinned_span(Session* session, const void* p, std::size_t n, PinnedRange& range) {
  if (!address_book().find_pinned(p, &range)) return false;
  std::size_t offset = static_cast<const std::byte*>(p) - range.base;
  if (n > range.bytes - offset) return false;
  if (range.ctx->session == session) return true;
  for (const PinnedRange::Elsewhere& slot : range.elsewhere) {
    if (slot.session == session) {
      range.region = slot.region;
      return true;
    }
  }
  range.region = register_elsewhere(session, range);
  return range.region != 0;
}

CUresult finish_sync(Session* session, CUresult rc) {
  CUresult async = session->take_async_error();
  return rc != CUDA_SUCCESS ? rc : async;
}

CUresult copy_htod(Context* ctx, Stream* stream, CUdeviceptr dst, const void* src, size_t n,
                   bool host_synchronous) {
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = reach_from(ctx->device, dst, n); rc != CUDA_SUCCESS) return rc;
  Session* session = ctx->session;
  PinnedRange pinned{};
  if (pinned_span(session, src, n, pinned)) {
    proto::CopyHostReq request{
        stream->wire,
        dst,
        n,
        {pinned.region,
         static_cast<std::uint64_t>(static_cast<const std::byte*>(src) - pinned.base),
         proto::HostKind::kPinnedRegion, 0}};
    if (!host_synchronous) return session->post(proto::Op::kCopyHtoD, request);
    CUresult rc = session->call(proto::Op::kCopyHtoD, &request, sizeof request, {}, nullptr, 0,
                                proto::kFlagReplyWhenDone);
    return finish_sync(session, rc);
  }
  if (CUresult rc = refuse_staged_copy_in_capture(ctx, stream); rc != CUDA_SUCCESS) return rc;
  const auto* bytes = static_cast<const std::byte*>(src);
  for (std::size_t offset = 0; offset < n;) {
    Session::Chunk chunk{};
    if (CUresult rc = session->acquire_chunk(chunk); rc != CUDA_SUCCESS) return rc;
    std::size_t piece = std::min<std::size_t>(session->chunk_bytes(), n - offset);
    staging_copy(chunk.data, bytes + offset, piece);
    proto::CopyHostReq request{stream->wire,
                               dst + offset,
                               piece,
                               {chunk.index, 0, proto::HostKind::kStagingChunk, chunk.generation}};
    CUresult rc = session->post(proto::Op::kCopyHtoD, request);
    if (rc == CUDA_SUCCESS) session->chunk_posted(chunk);
    session->release_chunk(chunk);
    if (rc != CUDA_SUCCESS) return rc;
    offset += piece;
  }
  return CUDA_SUCCESS;
}

// Device -> pageable host staging (copy_dtoh): piece size and pieces in flight. With copy
// helpers (libshim/copy_pool.hpp) the copy-out keeps up with larger pieces, which need fewer
// waits: 256 MiB at 30-34 GB/s with 2 MiB pieces against 19-21 with 512 KiB, 3-4 threads
// (tools/probes/parallel_staging.cpp on the H100 host).
constexpr std::size_t kDtoHPieceBytes = std::size_t{512} << 10;
constexpr std::size_t kDtoHPieceBytesParallel = std::size_t{2} << 20;
constexpr std::size_t kDtoHPiecesInFlight = 4;

CUresult copy_dtoh(Context* ctx, Stream* stream, void* dst, CUdeviceptr src, size_t n,
                   bool async_pinned_ok) {
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = reach_from(ctx->device, src, n); rc != CUDA_SUCCESS) return rc;
  Session* session = ctx->session;
  PinnedRange pinned{};
  if (pinned_span(session, dst, n, pinned)) {
    proto::CopyHostReq request{
        stream->wire,
        src,
        n,
        {pinned.region, static_cast<std::uint64_t>(static_cast<std::byte*>(dst) - pinned.base),
         proto::HostKind::kPinnedRegion, 0}};
    if (async_pinned_ok) return session->post(proto::Op::kCopyDtoH, request);
    CUresult rc = session->call(proto::Op::kCopyDtoH, &request, sizeof request, {}, nullptr, 0,
                                proto::kFlagReplyWhenDone);
    return finish_sync(session, rc);
  }
  if (CUresult rc = refuse_staged_copy_in_capture(ctx, stream); rc != CUDA_SUCCESS) return rc;
  // The CPU's copy-out is the bottleneck (the DMA runs ~4x faster), and a piece that waited long
  // after its DMA has left the last-level cache and is read from DRAM. So the DMA stays only a
  // few small pieces ahead: on an H100 host, 2 MiB x 8 in flight reached 0.64-0.76x of native
  // at 64-256 MiB, 512 KiB x 4 0.99-1.12x (tools/probes/staged_dtoh.cpp). Never more than half
  // the chunks: the rest stay free for the process's other threads.
  const std::size_t max_in_flight = std::min<std::size_t>(
      kDtoHPiecesInFlight, std::max<std::uint32_t>(1, session->chunk_count() / 2));
  const std::size_t piece_max = std::min<std::size_t>(
      copy_threads() > 1 ? kDtoHPieceBytesParallel : kDtoHPieceBytes, session->chunk_bytes());
  struct Piece {
    Session::Chunk chunk;
    std::size_t offset;
    std::size_t bytes;
  };
  std::deque<Piece> in_flight;
  auto* out = static_cast<std::byte*>(dst);
  CUresult result = CUDA_SUCCESS;
  std::size_t offset = 0;
  while ((offset < n && result == CUDA_SUCCESS) || !in_flight.empty()) {
    while (result == CUDA_SUCCESS && offset < n && in_flight.size() < max_in_flight) {
      Session::Chunk chunk{};
      if (CUresult rc = session->acquire_chunk(chunk); rc != CUDA_SUCCESS) {
        result = rc;
        break;
      }
      std::size_t piece = std::min<std::size_t>(piece_max, n - offset);
      proto::CopyHostReq request{
          stream->wire,
          src + offset,
          piece,
          {chunk.index, 0, proto::HostKind::kStagingChunk, chunk.generation}};
      if (CUresult rc = session->post(proto::Op::kCopyDtoH, request); rc != CUDA_SUCCESS) {
        session->release_chunk(chunk);
        result = rc;
        break;
      }
      session->chunk_posted(chunk);
      in_flight.push_back({chunk, offset, piece});
      offset += piece;
    }
    if (in_flight.empty()) break;
    Piece piece = in_flight.front();
    in_flight.pop_front();
    CUresult rc = session->wait_chunk(piece.chunk);
    if (rc == CUDA_SUCCESS && result == CUDA_SUCCESS) {
      staging_copy(out + piece.offset, piece.chunk.data, piece.bytes);
    } else if (result == CUDA_SUCCESS) {
      result = rc;
    }
    session->release_chunk(piece.chunk);
  }
  return finish_sync(session, result);
}

CUresult copy_dtod(Context* ctx, Stream* stream, CUdeviceptr dst, CUdeviceptr src, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  // Either side may be another GPU's: the copy runs on this stream's GPU over the peer link.
  if (CUresult rc = reach_from(ctx->device, dst, n); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = reach_from(ctx->device, src, n); rc != CUDA_SUCCESS) return rc;
  proto::CopyDtoDReq request{stream->wire, dst, src, n};
  return ctx->session->post(proto::Op::kCopyDtoD, request);
}

enum class Where { kDevice, kPinnedHost, kPageableHost };

// Unified addressing: what an address is, as far as this client knows.
Where classify(std::uint64_t address, const void** host) {
  if (address_book().find_device(address, nullptr)) return Where::kDevice;
  PinnedRange pinned{};
  if (address_book().find_pinned(reinterpret_cast<void*>(address), &pinned)) {
    *host = reinterpret_cast<void*>(address);
    return Where::kPinnedHost;
  }
  if (address_book().find_pinned_by_device(address, &pinned)) {
    *host = pinned.base + (address - pinned.device_pointer);
    return Where::kPinnedHost;
  }
  *host = reinterpret_cast<void*>(address);
  return Where::kPageableHost;
}

CUresult copy_unified(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream handle,
                      DefaultStream mode, bool async) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  const void* dst_host = nullptr;
  const void* src_host = nullptr;
  Where to = classify(dst, &dst_host);
  Where from = classify(src, &src_host);
  if (to == Where::kDevice && from == Where::kDevice) return copy_dtod(ctx, stream, dst, src, n);
  if (to == Where::kDevice) return copy_htod(ctx, stream, dst, src_host, n, !async);
  if (from == Where::kDevice) {
    return copy_dtoh(ctx, stream, const_cast<void*>(dst_host), src, n, async);
  }
  // Host to host: order after the stream's work, as a copy on the stream would be.
  if (async) {
    proto::HandleReq request{stream->wire};
    if (CUresult rc =
            ctx->session->call(proto::Op::kStreamSynchronize, request, static_cast<int*>(nullptr));
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  std::memmove(const_cast<void*>(dst_host), src_host, n);
  return CUDA_SUCCESS;
}

template <typename Fn>
CUresult with_stream(CUstream handle, DefaultStream mode, Fn&& fn) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  return fn(ctx, stream);
}

CUresult memset_2d(CUdeviceptr dst, size_t pitch, unsigned value, unsigned element_bytes,
                   size_t width, size_t height, CUstream handle, DefaultStream mode) {
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (height > 1 && pitch < width * element_bytes) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(handle, mode, [&](Context* ctx, Stream* stream) {
    if (CUresult rc = reach_from(ctx->device, dst, 1); rc != CUDA_SUCCESS) return rc;
    proto::MemsetReq request{stream->wire, dst,   height > 1 ? pitch : 0, width,
                             height,       value, element_bytes};
    return ctx->session->post(proto::Op::kMemset, request);
  });
}

constexpr auto kLegacy = DefaultStream::kLegacy;
constexpr auto kPerThread = DefaultStream::kPerThread;

}  // namespace

// ---- synchronous copies (legacy default stream; _ptds = the thread's default stream) ----

#define MPSSHIM_SYNC_COPIES(SUFFIX, MODE)                                                          \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2##SUFFIX(CUdeviceptr dst, const void* src,        \
                                                          size_t n) {                              \
    return finish_sync_memop(dst, MODE, with_stream(nullptr, MODE, [&](Context* ctx, Stream* s) {  \
                               return copy_htod(ctx, s, dst, src, n, true);                        \
                             }));                                                                  \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2##SUFFIX(void* dst, CUdeviceptr src, size_t n) {  \
    return with_stream(nullptr, MODE, [&](Context* ctx, Stream* s) {                               \
      return copy_dtoh(ctx, s, dst, src, n, false);                                                \
    });                                                                                            \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2##SUFFIX(CUdeviceptr dst, CUdeviceptr src,        \
                                                          size_t n) {                              \
    return finish_sync_memop(dst, MODE, with_stream(nullptr, MODE, [&](Context* ctx, Stream* s) {  \
                               return copy_dtod(ctx, s, dst, src, n);                              \
                             }));                                                                  \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy##SUFFIX(CUdeviceptr dst, CUdeviceptr src, size_t n) {   \
    return finish_sync_memop(dst, MODE, copy_unified(dst, src, n, nullptr, MODE, false));          \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD8_v2##SUFFIX(CUdeviceptr dst, unsigned char v,          \
                                                        size_t n) {                                \
    return finish_sync_memop(dst, MODE, memset_2d(dst, 0, v, 1, n, 1, nullptr, MODE));             \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD16_v2##SUFFIX(CUdeviceptr dst, unsigned short v,        \
                                                         size_t n) {                               \
    return finish_sync_memop(dst, MODE, memset_2d(dst, 0, v, 2, n, 1, nullptr, MODE));             \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD32_v2##SUFFIX(CUdeviceptr dst, unsigned int v,          \
                                                         size_t n) {                               \
    return finish_sync_memop(dst, MODE, memset_2d(dst, 0, v, 4, n, 1, nullptr, MODE));             \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD2D8_v2##SUFFIX(CUdeviceptr dst, size_t pitch,           \
                                                          unsigned char v, size_t w, size_t h) {   \
    return finish_sync_memop(dst, MODE, memset_2d(dst, pitch, v, 1, w, h, nullptr, MODE));         \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD2D16_v2##SUFFIX(CUdeviceptr dst, size_t pitch,          \
                                                           unsigned short v, size_t w, size_t h) { \
    return finish_sync_memop(dst, MODE, memset_2d(dst, pitch, v, 2, w, h, nullptr, MODE));         \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD2D32_v2##SUFFIX(CUdeviceptr dst, size_t pitch,          \
                                                           unsigned int v, size_t w, size_t h) {   \
    return finish_sync_memop(dst, MODE, memset_2d(dst, pitch, v, 4, w, h, nullptr, MODE));         \
  }

MPSSHIM_SYNC_COPIES(, kLegacy)
MPSSHIM_SYNC_COPIES(_ptds, kPerThread)
#undef MPSSHIM_SYNC_COPIES

// ---- asynchronous copies (_ptsz: a NULL stream means the thread's default stream) ----

#define MPSSHIM_ASYNC_COPIES(SUFFIX, MODE)                                                        \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2##SUFFIX(CUdeviceptr dst, const void* src,  \
                                                               size_t n, CUstream h) {            \
    return with_stream(                                                                           \
        h, MODE, [&](Context* ctx, Stream* s) { return copy_htod(ctx, s, dst, src, n, false); }); \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2##SUFFIX(void* dst, CUdeviceptr src,        \
                                                               size_t n, CUstream h) {            \
    return with_stream(                                                                           \
        h, MODE, [&](Context* ctx, Stream* s) { return copy_dtoh(ctx, s, dst, src, n, true); });  \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2##SUFFIX(CUdeviceptr dst, CUdeviceptr src,  \
                                                               size_t n, CUstream h) {            \
    return with_stream(h, MODE,                                                                   \
                       [&](Context* ctx, Stream* s) { return copy_dtod(ctx, s, dst, src, n); });  \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyAsync##SUFFIX(CUdeviceptr dst, CUdeviceptr src,         \
                                                        size_t n, CUstream h) {                   \
    return copy_unified(dst, src, n, h, MODE, true);                                              \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD8Async##SUFFIX(CUdeviceptr dst, unsigned char v,       \
                                                          size_t n, CUstream h) {                 \
    return memset_2d(dst, 0, v, 1, n, 1, h, MODE);                                                \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD16Async##SUFFIX(CUdeviceptr dst, unsigned short v,     \
                                                           size_t n, CUstream h) {                \
    return memset_2d(dst, 0, v, 2, n, 1, h, MODE);                                                \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD32Async##SUFFIX(CUdeviceptr dst, unsigned int v,       \
                                                           size_t n, CUstream h) {                \
    return memset_2d(dst, 0, v, 4, n, 1, h, MODE);                                                \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD2D8Async##SUFFIX(                                      \
      CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s) {           \
    return memset_2d(dst, pitch, v, 1, w, h, s, MODE);                                            \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD2D16Async##SUFFIX(                                     \
      CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s) {          \
    return memset_2d(dst, pitch, v, 2, w, h, s, MODE);                                            \
  }                                                                                               \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemsetD2D32Async##SUFFIX(                                     \
      CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s) {            \
    return memset_2d(dst, pitch, v, 4, w, h, s, MODE);                                            \
  }

MPSSHIM_ASYNC_COPIES(, kLegacy)
MPSSHIM_ASYNC_COPIES(_ptsz, kPerThread)
#undef MPSSHIM_ASYNC_COPIES

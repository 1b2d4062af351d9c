// 2D and 3D copies (cuMemcpy2D*, cuMemcpy3D*), the array copies of cuMemcpyAtoH & co, and peer
// copies on one GPU. Every form becomes a CUDA_MEMCPY3D; each side is device memory, our pinned
// memory (addressed in place by the server), pageable memory, or a CUDA array. A copy whose
// sides the server can reach is one Copy3D record. A copy from or to pageable memory is staged:
// the box is cut into row groups that fit a staging chunk (rows wider than a chunk into pieces),
// packed in the chunk, and each group is one record, pipelined as copy.cpp pipelines 1-D copies.
// Host synchronization follows CUDA's "API synchronization behavior", as copy.cpp does.
#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/peer.hpp"
#include "proto/ops_copies.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

enum class Kind { kDevice, kPinned, kPageable, kArray };

// One side of the copy as this client sees it.
struct Side {
  Kind kind = Kind::kDevice;
  std::uint64_t device = 0;   // kDevice
  std::byte* host = nullptr;  // kPinned, kPageable: the side's origin (0, 0, 0)
  PinnedRange pinned{};       // kPinned
  Array* array = nullptr;     // kArray
  std::uint64_t x = 0, y = 0, z = 0, pitch = 0, height = 0;

  std::byte* row(std::uint64_t dy, std::uint64_t dz) const {
    return host + ((z + dz) * height + y + dy) * pitch + x;
  }
};

struct Box {
  std::uint64_t width, height, depth;
};

// Offset one past the last byte the box touches in linear memory laid out as `s`; 0 when that
// overflows.
std::uint64_t linear_end(const Side& s, const Box& b) {
  __extension__ using u128 = unsigned __int128;
  u128 end = ((u128{s.z} + b.depth - 1) * s.height + s.y + b.height - 1) * s.pitch + s.x + b.width;
  return end > ~std::uint64_t{0} ? 0 : static_cast<std::uint64_t>(end);
}

CUresult classify(CUmemorytype type, const void* host, CUdeviceptr device, CUarray array,
                  std::size_t x, std::size_t y, std::size_t z, std::size_t pitch,
                  std::size_t height, const Box& box, Side& out) {
  out = Side{};
  out.x = x;
  out.y = y;
  out.z = z;
  out.pitch = pitch;
  out.height = height;
  if (type == CU_MEMORYTYPE_ARRAY) {
    out.kind = Kind::kArray;
    out.array = object_of<Array>(array);
    return out.array == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
  }
  if ((box.height > 1 || box.depth > 1) && pitch < x + box.width) return CUDA_ERROR_INVALID_VALUE;
  if (box.depth > 1 && height < y + box.height) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t end = linear_end(out, box);
  if (end == 0) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t address = 0;
  switch (type) {
    case CU_MEMORYTYPE_DEVICE:
      out.kind = Kind::kDevice;
      out.device = device;
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_HOST:
      if (host == nullptr) return CUDA_ERROR_INVALID_VALUE;
      address = reinterpret_cast<std::uint64_t>(host);
      break;
    case CU_MEMORYTYPE_UNIFIED:
      address = device;
      if (address_book().find_device(address, nullptr)) {
        out.kind = Kind::kDevice;
        out.device = device;
        return CUDA_SUCCESS;
      }
      if (address_book().find_pinned_by_device(address, &out.pinned) &&
          !address_book().find_pinned(reinterpret_cast<void*>(address), nullptr)) {
        address = reinterpret_cast<std::uint64_t>(out.pinned.base) +
                  (address - out.pinned.device_pointer);
      }
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  out.host = reinterpret_cast<std::byte*>(address);
  // Our pinned memory when the whole box lies in one region, else pageable.
  if (address_book().find_pinned(out.host, &out.pinned) &&
      static_cast<std::uint64_t>(out.host - out.pinned.base) + end <= out.pinned.bytes) {
    out.kind = Kind::kPinned;
  } else {
    out.kind = Kind::kPageable;
  }
  return CUDA_SUCCESS;
}

// The wire form of a side the server reaches itself.
proto::CopySide wire_side(const Side& s) {
  proto::CopySide w{0, 0, s.x, s.y, s.z, s.pitch, s.height, proto::CopySideKind::kDevice, 0};
  switch (s.kind) {
    case Kind::kDevice:
      w.handle = s.device;
      break;
    case Kind::kPinned:
      w.kind = proto::CopySideKind::kPinnedRegion;
      w.handle = s.pinned.region;
      w.offset = static_cast<std::uint64_t>(s.host - s.pinned.base);
      break;
    case Kind::kArray:
      w.kind = proto::CopySideKind::kArray;
      w.handle = s.array->wire;
      w.pitch = 0;
      w.height = 0;
      break;
    case Kind::kPageable:
      break;
  }
  return w;
}

CUresult finish_sync(Session* session, CUresult rc) {
  CUresult async = session->take_async_error();
  return rc != CUDA_SUCCESS ? rc : async;
}

// A row group of a staged copy: rows [y, y + rows) of slice z, bytes [x, x + width) of each.
struct Piece {
  std::uint64_t x, y, z, width, rows;
};

std::vector<Piece> cut(const Box& box, std::uint64_t chunk_bytes) {
  std::vector<Piece> pieces;
  for (std::uint64_t z = 0; z < box.depth; ++z) {
    if (box.width <= chunk_bytes) {
      const std::uint64_t per_chunk = chunk_bytes / box.width;
      for (std::uint64_t y = 0; y < box.height; y += per_chunk) {
        pieces.push_back({0, y, z, box.width, std::min(per_chunk, box.height - y)});
      }
    } else {
      for (std::uint64_t y = 0; y < box.height; ++y) {
        for (std::uint64_t x = 0; x < box.width; x += chunk_bytes) {
          pieces.push_back({x, y, z, std::min(chunk_bytes, box.width - x), 1});
        }
      }
    }
  }
  return pieces;
}

// The record for one piece: the staged side is the chunk, rows packed; the other side's origin
// moves to the piece.
proto::Copy3DReq piece_request(Stream* stream, const Side& remote, bool to_remote, const Piece& p,
                               const Session::Chunk& chunk) {
  proto::CopySide far = wire_side(remote);
  far.x_bytes += p.x;
  far.y += p.y;
  far.z += p.z;
  proto::CopySide near{
      chunk.index,     0, 0, 0, 0, p.width, p.rows, proto::CopySideKind::kStagingChunk,
      chunk.generation};
  return proto::Copy3DReq{stream->wire,          p.width, p.rows, 1, to_remote ? near : far,
                          to_remote ? far : near};
}

void pack(const Side& host, const Piece& p, std::byte* chunk) {
  for (std::uint64_t r = 0; r < p.rows; ++r) {
    std::memcpy(chunk + r * p.width, host.row(p.y + r, p.z) + p.x, p.width);
  }
}

void unpack(const Side& host, const Piece& p, const std::byte* chunk) {
  for (std::uint64_t r = 0; r < p.rows; ++r) {
    std::memcpy(host.row(p.y + r, p.z) + p.x, chunk + r * p.width, p.width);
  }
}

// Pageable source: returns once every piece is staged (the DMA may still run).
CUresult stage_in(Session* session, Stream* stream, const Side& host, const Side& remote,
                  const Box& box) {
  for (const Piece& p : cut(box, session->chunk_bytes())) {
    Session::Chunk chunk{};
    if (CUresult rc = session->acquire_chunk(chunk); rc != CUDA_SUCCESS) return rc;
    pack(host, p, chunk.data);
    proto::Copy3DReq request = piece_request(stream, remote, true, p, chunk);
    CUresult rc = session->post(proto::Op::kCopy3D, request);
    if (rc == CUDA_SUCCESS) session->chunk_posted(chunk);
    session->release_chunk(chunk);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

// Pageable destination: returns once every piece has landed.
CUresult stage_out(Session* session, Stream* stream, const Side& host, const Side& remote,
                   const Box& box) {
  const std::vector<Piece> pieces = cut(box, session->chunk_bytes());
  const std::size_t max_in_flight = std::max<std::uint32_t>(1, session->chunk_count() / 2);
  struct InFlight {
    Session::Chunk chunk;
    std::size_t piece;
  };
  std::deque<InFlight> in_flight;
  CUresult result = CUDA_SUCCESS;
  std::size_t next = 0;
  while ((next < pieces.size() && result == CUDA_SUCCESS) || !in_flight.empty()) {
    while (result == CUDA_SUCCESS && next < pieces.size() && in_flight.size() < max_in_flight) {
      Session::Chunk chunk{};
      if (CUresult rc = session->acquire_chunk(chunk); rc != CUDA_SUCCESS) {
        result = rc;
        break;
      }
      proto::Copy3DReq request = piece_request(stream, remote, false, pieces[next], chunk);
      if (CUresult rc = session->post(proto::Op::kCopy3D, request); rc != CUDA_SUCCESS) {
        session->release_chunk(chunk);
        result = rc;
        break;
      }
      session->chunk_posted(chunk);
      in_flight.push_back({chunk, next++});
    }
    if (in_flight.empty()) break;
    InFlight f = in_flight.front();
    in_flight.pop_front();
    CUresult rc = session->wait_chunk(f.chunk);
    if (rc == CUDA_SUCCESS && result == CUDA_SUCCESS) {
      unpack(host, pieces[f.piece], f.chunk.data);
    } else if (result == CUDA_SUCCESS) {
      result = rc;
    }
    session->release_chunk(f.chunk);
  }
  return finish_sync(session, result);
}

bool is_host(const Side& s) {
  return s.kind == Kind::kPinned || s.kind == Kind::kPageable;
}

CUresult copy_3d(const CUDA_MEMCPY3D* c, CUstream handle, DefaultStream mode, bool async) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (c->srcLOD != 0 || c->dstLOD != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  const Box box{c->WidthInBytes, c->Height, c->Depth};
  if (box.width == 0 || box.height == 0 || box.depth == 0) return CUDA_SUCCESS;
  Side src, dst;
  if (CUresult rc = classify(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray,
                             c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight, box, src);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (CUresult rc = classify(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray,
                             c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch, c->dstHeight, box, dst);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  for (const Side* s : {&src, &dst}) {
    if (s->kind == Kind::kArray && s->array->ctx->session != ctx->session) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Another GPU's linear memory: mapped into this stream's GPU's server (its whole block).
    if (s->kind == Kind::kDevice) {
      if (CUresult rc = reach_from(ctx->device, s->device, 1); rc != CUDA_SUCCESS) return rc;
    }
  }
  Session* session = ctx->session;

  if (is_host(src) && is_host(dst)) {
    // Host to host: ordered after the stream's work, as a copy on the stream would be.
    if (async) {
      proto::HandleReq request{stream->wire};
      if (CUresult rc =
              session->call(proto::Op::kStreamSynchronize, request, static_cast<int*>(nullptr));
          rc != CUDA_SUCCESS) {
        return rc;
      }
    }
    for (std::uint64_t z = 0; z < box.depth; ++z) {
      for (std::uint64_t y = 0; y < box.height; ++y) {
        std::memmove(dst.row(y, z), src.row(y, z), box.width);
      }
    }
    return CUDA_SUCCESS;
  }
  if (src.kind == Kind::kPageable) return stage_in(session, stream, src, dst, box);
  if (dst.kind == Kind::kPageable) return stage_out(session, stream, dst, src, box);

  proto::Copy3DReq request{stream->wire, box.width,      box.height,
                           box.depth,    wire_side(src), wire_side(dst)};
  // Pinned host memory on either side: a synchronous copy returns once it completed.
  if (async || !(is_host(src) || is_host(dst))) return session->post(proto::Op::kCopy3D, request);
  CUresult rc = session->call(proto::Op::kCopy3D, &request, sizeof request, {}, nullptr, 0,
                              proto::kFlagReplyWhenDone);
  return finish_sync(session, rc);
}

CUDA_MEMCPY3D from_2d(const CUDA_MEMCPY2D* c) {
  CUDA_MEMCPY3D out{};
  out.srcXInBytes = c->srcXInBytes;
  out.srcY = c->srcY;
  out.srcMemoryType = c->srcMemoryType;
  out.srcHost = c->srcHost;
  out.srcDevice = c->srcDevice;
  out.srcArray = c->srcArray;
  out.srcPitch = c->srcPitch;
  out.srcHeight = c->srcY + c->Height;  // one slice: its height only bounds the rows
  out.dstXInBytes = c->dstXInBytes;
  out.dstY = c->dstY;
  out.dstMemoryType = c->dstMemoryType;
  out.dstHost = c->dstHost;
  out.dstDevice = c->dstDevice;
  out.dstArray = c->dstArray;
  out.dstPitch = c->dstPitch;
  out.dstHeight = c->dstY + c->Height;
  out.WidthInBytes = c->WidthInBytes;
  out.Height = c->Height;
  out.Depth = 1;
  return out;
}

CUresult copy_2d(const CUDA_MEMCPY2D* c, CUstream handle, DefaultStream mode, bool async) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D three = from_2d(c);
  return copy_3d(&three, handle, mode, async);
}

// Peer copies: the copy runs on the stream's GPU; memory of the other GPU is mapped into that
// GPU's server first (peer.hpp), so the copy goes over the peer link as natively.
CUresult check_contexts(CUcontext dst_ctx, CUcontext src_ctx) {
  if (object_of<Context>(dst_ctx) == nullptr || object_of<Context>(src_ctx) == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return CUDA_SUCCESS;
}

// cuMemcpyPeer and cuMemcpy3DPeer are serialized with all pending and future work of the
// current, source and destination contexts (the driver's contract; the Async forms are not). A
// context of another GPU lives on another server, whose queue the current one's cannot wait on:
// its pending work is waited for before the copy is sent (the copy must read what it wrote) and
// the copy itself before returning (its later work must not overtake the copy). Contexts of the
// current one's GPU share its server and stream order: nothing to wait for.
class PeerSerialization {
 public:
  // Waits for the pending work of `src_ctx` and `dst_ctx` where they are on another server than
  // the current context.
  CUresult before(CUcontext dst_ctx, CUcontext src_ctx) {
    Context* current_ctx = nullptr;
    if (CUresult rc = current(current_ctx); rc != CUDA_SUCCESS) return rc;
    for (CUcontext other : {src_ctx, dst_ctx}) {
      Context* o = object_of<Context>(other);
      if (o == nullptr || o->session == current_ctx->session) continue;
      crossed_ = true;
      if (CUresult rc = cuCtxSynchronize_v2(other); rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
  }
  // Waits for the copy sent (`sent`: its result) when another server was involved.
  CUresult after(CUresult sent) {
    if (sent != CUDA_SUCCESS || !crossed_) return sent;
    return cuCtxSynchronize();
  }

 private:
  bool crossed_ = false;
};

CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                   CUstream handle, DefaultStream mode, bool async) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_contexts(dst_ctx, src_ctx); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = reach_from(ctx->device, dst, n); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = reach_from(ctx->device, src, n); rc != CUDA_SUCCESS) return rc;
  PeerSerialization serialized;
  if (!async) {
    if (CUresult rc = serialized.before(dst_ctx, src_ctx); rc != CUDA_SUCCESS) return rc;
  }
  proto::CopyDtoDReq request{stream->wire, dst, src, n};
  CUresult sent = ctx->session->post(proto::Op::kCopyDtoD, request);
  return async ? sent : serialized.after(sent);
}

CUresult copy_3d_peer(const CUDA_MEMCPY3D_PEER* c, CUstream handle, DefaultStream mode,
                      bool async) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = check_contexts(c->dstContext, c->srcContext); rc != CUDA_SUCCESS) return rc;
  CUDA_MEMCPY3D three{};
  three.srcXInBytes = c->srcXInBytes;
  three.srcY = c->srcY;
  three.srcZ = c->srcZ;
  three.srcLOD = c->srcLOD;
  three.srcMemoryType = c->srcMemoryType;
  three.srcHost = c->srcHost;
  three.srcDevice = c->srcDevice;
  three.srcArray = c->srcArray;
  three.srcPitch = c->srcPitch;
  three.srcHeight = c->srcHeight;
  three.dstXInBytes = c->dstXInBytes;
  three.dstY = c->dstY;
  three.dstZ = c->dstZ;
  three.dstLOD = c->dstLOD;
  three.dstMemoryType = c->dstMemoryType;
  three.dstHost = c->dstHost;
  three.dstDevice = c->dstDevice;
  three.dstArray = c->dstArray;
  three.dstPitch = c->dstPitch;
  three.dstHeight = c->dstHeight;
  three.WidthInBytes = c->WidthInBytes;
  three.Height = c->Height;
  three.Depth = c->Depth;
  PeerSerialization serialized;
  if (!async) {
    if (CUresult rc = serialized.before(c->dstContext, c->srcContext); rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  CUresult sent = copy_3d(&three, handle, mode, async);
  return async ? sent : serialized.after(sent);
}

// One row of `bytes` between an array (at byte `offset` of its first row) and linear memory.
CUDA_MEMCPY3D array_row(std::size_t bytes) {
  CUDA_MEMCPY3D c{};
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  return c;
}
void set_array(CUmemorytype& type, CUarray& slot, std::size_t& x, CUarray array,
               std::size_t offset) {
  type = CU_MEMORYTYPE_ARRAY;
  slot = array;
  x = offset;
}

CUresult atoh(void* dst, CUarray src, size_t offset, size_t n, CUstream h, DefaultStream mode,
              bool async) {
  CUDA_MEMCPY3D c = array_row(n);
  set_array(c.srcMemoryType, c.srcArray, c.srcXInBytes, src, offset);
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = dst;
  c.dstPitch = n;
  c.dstHeight = 1;
  return copy_3d(&c, h, mode, async);
}

CUresult htoa(CUarray dst, size_t offset, const void* src, size_t n, CUstream h, DefaultStream mode,
              bool async) {
  CUDA_MEMCPY3D c = array_row(n);
  set_array(c.dstMemoryType, c.dstArray, c.dstXInBytes, dst, offset);
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = src;
  c.srcPitch = n;
  c.srcHeight = 1;
  return copy_3d(&c, h, mode, async);
}

CUresult atod(CUdeviceptr dst, CUarray src, size_t offset, size_t n, DefaultStream mode) {
  CUDA_MEMCPY3D c = array_row(n);
  set_array(c.srcMemoryType, c.srcArray, c.srcXInBytes, src, offset);
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dst;
  c.dstPitch = n;
  c.dstHeight = 1;
  return copy_3d(&c, nullptr, mode, false);
}

CUresult dtoa(CUarray dst, size_t offset, CUdeviceptr src, size_t n, DefaultStream mode) {
  CUDA_MEMCPY3D c = array_row(n);
  set_array(c.dstMemoryType, c.dstArray, c.dstXInBytes, dst, offset);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = src;
  c.srcPitch = n;
  c.srcHeight = 1;
  return copy_3d(&c, nullptr, mode, false);
}

CUresult atoa(CUarray dst, size_t dst_offset, CUarray src, size_t src_offset, size_t n,
              DefaultStream mode) {
  CUDA_MEMCPY3D c = array_row(n);
  set_array(c.srcMemoryType, c.srcArray, c.srcXInBytes, src, src_offset);
  set_array(c.dstMemoryType, c.dstArray, c.dstXInBytes, dst, dst_offset);
  return copy_3d(&c, nullptr, mode, false);
}

constexpr auto kLegacy = DefaultStream::kLegacy;
constexpr auto kPerThread = DefaultStream::kPerThread;

}  // namespace

// ---- synchronous forms (legacy default stream; _ptds = the thread's default stream) ----

#define MPSSHIM_SYNC_COPIES_3D(SUFFIX, MODE)                                                     \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy2D_v2##SUFFIX(const CUDA_MEMCPY2D* c) {                \
    return copy_2d(c, nullptr, MODE, false);                                                     \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2##SUFFIX(const CUDA_MEMCPY2D* c) {       \
    return copy_2d(c, nullptr, MODE, false);                                                     \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3D_v2##SUFFIX(const CUDA_MEMCPY3D* c) {                \
    return copy_3d(c, nullptr, MODE, false);                                                     \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyAtoH_v2##SUFFIX(void* dst, CUarray src, size_t offset, \
                                                          size_t n) {                            \
    return atoh(dst, src, offset, n, nullptr, MODE, false);                                      \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyHtoA_v2##SUFFIX(CUarray dst, size_t offset,            \
                                                          const void* src, size_t n) {           \
    return htoa(dst, offset, src, n, nullptr, MODE, false);                                      \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyAtoD_v2##SUFFIX(CUdeviceptr dst, CUarray src,          \
                                                          size_t offset, size_t n) {             \
    return atod(dst, src, offset, n, MODE);                                                      \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyDtoA_v2##SUFFIX(CUarray dst, size_t offset,            \
                                                          CUdeviceptr src, size_t n) {           \
    return dtoa(dst, offset, src, n, MODE);                                                      \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyAtoA_v2##SUFFIX(                                       \
      CUarray dst, size_t dst_offset, CUarray src, size_t src_offset, size_t n) {                \
    return atoa(dst, dst_offset, src, src_offset, n, MODE);                                      \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyPeer##SUFFIX(                                          \
      CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {        \
    return copy_peer(dst, dst_ctx, src, src_ctx, n, nullptr, MODE, false);                       \
  }                                                                                              \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DPeer##SUFFIX(const CUDA_MEMCPY3D_PEER* c) {          \
    return copy_3d_peer(c, nullptr, MODE, false);                                                \
  }

MPSSHIM_SYNC_COPIES_3D(, kLegacy)
MPSSHIM_SYNC_COPIES_3D(_ptds, kPerThread)
#undef MPSSHIM_SYNC_COPIES_3D

// ---- asynchronous forms (_ptsz: a NULL stream means the thread's default stream) ----

#define MPSSHIM_ASYNC_COPIES_3D(SUFFIX, MODE)                                                      \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2##SUFFIX(const CUDA_MEMCPY2D* c, CUstream h) { \
    return copy_2d(c, h, MODE, true);                                                              \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DAsync_v2##SUFFIX(const CUDA_MEMCPY3D* c, CUstream h) { \
    return copy_3d(c, h, MODE, true);                                                              \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyAtoHAsync_v2##SUFFIX(                                    \
      void* dst, CUarray src, size_t offset, size_t n, CUstream h) {                               \
    return atoh(dst, src, offset, n, h, MODE, true);                                               \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyHtoAAsync_v2##SUFFIX(                                    \
      CUarray dst, size_t offset, const void* src, size_t n, CUstream h) {                         \
    return htoa(dst, offset, src, n, h, MODE, true);                                               \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpyPeerAsync##SUFFIX(CUdeviceptr dst, CUcontext dst_ctx,    \
                                                            CUdeviceptr src, CUcontext src_ctx,    \
                                                            size_t n, CUstream h) {                \
    return copy_peer(dst, dst_ctx, src, src_ctx, n, h, MODE, true);                                \
  }                                                                                                \
  MPSSHIM_EXPORT CUresult CUDAAPI cuMemcpy3DPeerAsync##SUFFIX(const CUDA_MEMCPY3D_PEER* c,         \
                                                              CUstream h) {                        \
    return copy_3d_peer(c, h, MODE, true);                                                         \
  }

MPSSHIM_ASYNC_COPIES_3D(, kLegacy)
MPSSHIM_ASYNC_COPIES_3D(_ptsz, kPerThread)
#undef MPSSHIM_ASYNC_COPIES_3D

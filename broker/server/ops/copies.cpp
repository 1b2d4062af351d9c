// 2D/3D copies, CUDA arrays, texture and surface objects. Every side of a copy and every
// resource of a texture must be the client's own: device ranges are checked against its
// allocation map (the whole box, from its first byte to its last), host ranges against its
// pinned region or the staging chunk, arrays against its handle table and the array's extent.
#include <algorithm>
#include <limits>

#include "broker/server/ops/array_format.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"
#include "proto/ops_copies.hpp"

namespace mpsshim::server {
namespace {

__extension__ using u128 = unsigned __int128;
constexpr u128 kMax64 = std::numeric_limits<std::uint64_t>::max();

// One side of a copy, as the driver takes it.
struct Side {
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  CUdeviceptr device = 0;
  void* host = nullptr;
  CUarray array = nullptr;
  bool chunk = false;
};

// A 3D copy's bytes by direction (mpsshimctl ps): staging chunks and pinned regions are host
// memory, device pointers and CUDA arrays device memory.
void count_copy_3d(ClientUsage& usage, const proto::Copy3DReq& req) {
  auto host = [](const proto::CopySide& s) {
    return s.kind == proto::CopySideKind::kStagingChunk ||
           s.kind == proto::CopySideKind::kPinnedRegion;
  };
  const u128 bytes = u128{req.width_bytes} * req.height * req.depth;
  const auto counted = static_cast<std::uint64_t>(bytes > kMax64 ? kMax64 : bytes);
  if (host(req.src) && !host(req.dst)) {
    usage.bytes_h2d += counted;
  } else if (!host(req.src) && host(req.dst)) {
    usage.bytes_d2h += counted;
  } else if (!host(req.src) && !host(req.dst)) {
    usage.bytes_d2d += counted;
  }
}

// Offsets of the first and one past the last byte the box touches in linear memory laid out
// with `pitch` and `height` (rows per slice), as the driver addresses it. False on overflow.
bool linear_extent(const proto::CopySide& s, const proto::Copy3DReq& r, std::uint64_t& first,
                   std::uint64_t& end) {
  const u128 slice = u128{s.pitch} * s.height;
  const u128 start = u128{s.z} * slice + u128{s.y} * s.pitch + s.x_bytes;
  const u128 last = u128{s.z + u128{r.depth} - 1} * slice + (u128{s.y} + r.height - 1) * s.pitch +
                    s.x_bytes + r.width_bytes;
  if (last > kMax64) return false;
  first = static_cast<std::uint64_t>(start);
  end = static_cast<std::uint64_t>(last);
  return true;
}

// Checks a side against what the client owns and says where it is. Zero-sized boxes never
// reach here.
bool resolve_side(Session& session, const proto::Copy3DReq& r, const proto::CopySide& s,
                  Side& out) {
  if (s.kind == proto::CopySideKind::kArray) {
    const ArrayObj* array = session.objects.get<ArrayObj>(s.handle);
    if (array == nullptr) return false;
    const u128 row = u128{array->desc.Width} * array->element_bytes;
    const u128 rows = std::max<std::size_t>(array->desc.Height, 1);
    const u128 slices = std::max<std::size_t>(array->desc.Depth, 1);
    if (u128{s.x_bytes} + r.width_bytes > row || u128{s.y} + r.height > rows ||
        u128{s.z} + r.depth > slices) {
      return false;
    }
    out.type = CU_MEMORYTYPE_ARRAY;
    out.array = array->array;
    return true;
  }
  std::uint64_t first = 0, end = 0;
  if (!linear_extent(s, r, first, end)) return false;
  switch (s.kind) {
    case proto::CopySideKind::kDevice:
      if (u128{s.handle} + end > kMax64) return false;
      if (!session.memory.contains(s.handle + first, end - first)) return false;
      out.type = CU_MEMORYTYPE_DEVICE;
      out.device = s.handle;
      return true;
    case proto::CopySideKind::kPinnedRegion: {
      const HostRegionObj* region = session.objects.get<HostRegionObj>(s.handle);
      if (region == nullptr || u128{s.offset} + end > region->bytes) return false;
      out.type = CU_MEMORYTYPE_HOST;
      out.host = static_cast<std::byte*>(region->address) + s.offset;
      return true;
    }
    case proto::CopySideKind::kStagingChunk: {
      const proto::SegmentHeader& g = session.segment.geometry();
      if (s.handle >= g.chunk_count || u128{s.offset} + end > g.chunk_bytes) return false;
      out.type = CU_MEMORYTYPE_HOST;
      out.host = session.segment.view().chunk(static_cast<std::uint32_t>(s.handle)) + s.offset;
      out.chunk = true;
      return true;
    }
    default:
      return false;
  }
}

void fill(const proto::CopySide& s, const Side& side, CUmemorytype& type, std::size_t& x,
          std::size_t& y, std::size_t& z, const void** host, CUdeviceptr& device, CUarray& array,
          std::size_t& pitch, std::size_t& height) {
  type = side.type;
  x = s.x_bytes;
  y = s.y;
  z = s.z;
  *host = side.host;
  device = side.device;
  array = side.array;
  pitch = side.type == CU_MEMORYTYPE_ARRAY ? 0 : s.pitch;
  height = side.type == CU_MEMORYTYPE_ARRAY ? 0 : s.height;
}

// The driver's resource description for a client's one; false if it names anything not the
// client's own.
CUresult resolve_resource(Call& call, const proto::WireResourceDesc& w, CUDA_RESOURCE_DESC& out) {
  Session& session = call.session;
  out = CUDA_RESOURCE_DESC{};
  out.flags = w.flags;
  switch (w.type) {
    case CU_RESOURCE_TYPE_ARRAY: {
      const ArrayObj* array = session.objects.get<ArrayObj>(w.handle);
      if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      out.resType = CU_RESOURCE_TYPE_ARRAY;
      out.res.array.hArray = array->array;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      const MipmappedArrayObj* mipmap = session.objects.get<MipmappedArrayObj>(w.handle);
      if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      out.resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
      out.res.mipmap.hMipmappedArray = mipmap->mipmap;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_LINEAR:
      if (!session.memory.contains(w.handle, w.size_bytes) || w.size_bytes == 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      out.resType = CU_RESOURCE_TYPE_LINEAR;
      out.res.linear.devPtr = w.handle;
      out.res.linear.format = static_cast<CUarray_format>(w.format);
      out.res.linear.numChannels = w.channels;
      out.res.linear.sizeInBytes = w.size_bytes;
      return CUDA_SUCCESS;
    case CU_RESOURCE_TYPE_PITCH2D: {
      if (w.width == 0 || w.height == 0) return CUDA_ERROR_INVALID_VALUE;
      // Formats of unknown element size are checked over whole rows.
      std::uint64_t element = proto::element_bytes(w.format, w.channels);
      const u128 row = element != 0 ? u128{w.width} * element : u128{w.pitch};
      const u128 extent = u128{w.height - 1} * w.pitch + row;
      if (extent > kMax64 ||
          !session.memory.contains(w.handle, static_cast<std::uint64_t>(extent))) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      out.resType = CU_RESOURCE_TYPE_PITCH2D;
      out.res.pitch2D.devPtr = w.handle;
      out.res.pitch2D.format = static_cast<CUarray_format>(w.format);
      out.res.pitch2D.numChannels = w.channels;
      out.res.pitch2D.width = w.width;
      out.res.pitch2D.height = w.height;
      out.res.pitch2D.pitchInBytes = w.pitch;
      return CUDA_SUCCESS;
    }
    default:
      log_warn(
          "{} asked for a texture or surface over a resource of type {}; mpsshim supports "
          "arrays, linear and pitch2D resources (mipmapped arrays are not supported)",
          session.who(), w.type);
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

OpResult finish_object(Call& call, CUresult created, unsigned long long value, bool surface,
                       std::uint64_t ctx) {
  if (created != CUDA_SUCCESS) return call.done(created);
  const DriverTable& cu = call.cu;
  std::uint64_t id = call.session.objects.insert(TexObj{value, surface, ctx});
  if (id == 0) {
    surface ? cu.cuSurfObjectDestroy(value) : cu.cuTexObjectDestroy(value);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::TexObjectRep{id, value});
}

OpResult destroy_object(Call& call, bool surface) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  TexObj* object = session.objects.get<TexObj>(req.handle);
  if (object == nullptr || object->surface != surface) return call.done(CUDA_ERROR_INVALID_VALUE);
  Retired bundle;
  bundle.textures.push_back(*session.objects.take<TexObj>(req.handle));
  return call.done(retire(session, std::move(bundle)));
}

}  // namespace

OpResult op_copy_3d(Call& call) {
  auto req = call.request<proto::Copy3DReq>();
  Session& session = call.session;
  const bool src_chunk = req.src.kind == proto::CopySideKind::kStagingChunk;
  const bool dst_chunk = req.dst.kind == proto::CopySideKind::kStagingChunk;
  if (src_chunk && dst_chunk) return call.malformed("sent a 3D copy between two staging chunks");
  const proto::CopySide& staged = src_chunk ? req.src : req.dst;
  const bool names_chunk =
      (src_chunk || dst_chunk) && staged.handle < session.segment.geometry().chunk_count;
  const auto chunk = static_cast<std::uint32_t>(staged.handle);
  // As copy_host: a staging chunk is handed back whatever happens, its error stored first.
  auto fail = [&](CUresult r) {
    OpResult result = call.done(r);
    if (names_chunk) {
      if (!call.has_reply_slot()) {
        session.post_async_error(r);
        result.post_async_error = false;
      }
      session.finish_chunk(chunk, staged.generation, r);
    }
    return result;
  };
  if (req.width_bytes == 0 || req.height == 0 || req.depth == 0) return fail(CUDA_SUCCESS);
  Side src, dst;
  if (!resolve_side(session, req, req.src, src) || !resolve_side(session, req, req.dst, dst)) {
    return fail(CUDA_ERROR_INVALID_VALUE);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return fail(error);
  open_busy_span(session, stream->stream);

  CUDA_MEMCPY3D copy{};
  fill(req.src, src, copy.srcMemoryType, copy.srcXInBytes, copy.srcY, copy.srcZ, &copy.srcHost,
       copy.srcDevice, copy.srcArray, copy.srcPitch, copy.srcHeight);
  const void* dst_host = nullptr;
  fill(req.dst, dst, copy.dstMemoryType, copy.dstXInBytes, copy.dstY, copy.dstZ, &dst_host,
       copy.dstDevice, copy.dstArray, copy.dstPitch, copy.dstHeight);
  copy.dstHost = const_cast<void*>(dst_host);
  copy.WidthInBytes = req.width_bytes;
  copy.Height = req.height;
  copy.Depth = req.depth;
  CUresult r = call.cu.cuMemcpy3DAsync_v2(&copy, stream->stream);
  if (r != CUDA_SUCCESS) return fail(r);
  count_copy_3d(session.usage, req);
  if (!names_chunk) return finish_on_stream(call, *stream, r);

  Completion completion;
  completion.chunk = chunk;
  completion.generation = staged.generation;
  completion.op = call.op();
  if (call.reply_when_done()) completion.slot = call.header.reply_slot;
  if (CUresult recorded = session.complete_after(stream->stream, std::move(completion));
      recorded != CUDA_SUCCESS) {
    return fail(recorded);
  }
  return call.reply_when_done() ? call.deferred() : call.done();
}

OpResult op_array_create(Call& call) {
  auto req = call.request<proto::ArrayCreateReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  const proto::ArrayDescriptor& d = req.desc;
  if (CUresult r = check_array_format(session, d, "a CUDA array"); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  const std::uint64_t element = proto::element_bytes(d.format, d.channels);
  if (d.width == 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  // What the array holds; the driver's tiled layout may take somewhat more.
  const u128 bytes = u128{d.width} * std::max<std::uint64_t>(d.height, 1) *
                     std::max<std::uint64_t>(d.depth, 1) * element;
  if (bytes > kMax64) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t charged = charged_at_creation(d, static_cast<std::uint64_t>(bytes));
  auto held = session.charge.reserve(charged);
  if (!held) return refuse_over_limit(call, charged, "a CUDA array", held.error());

  const CUDA_ARRAY3D_DESCRIPTOR desc = driver_descriptor(d);
  CUarray array = nullptr;
  if (CUresult r = call.cu.cuArray3DCreate_v2(&array, &desc); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::uint64_t id = session.objects.insert(ArrayObj{array, req.ctx, desc, element, charged});
  if (id == 0) {
    call.cu.cuArrayDestroy(array);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  held->keep();
  return call.reply(proto::ArrayCreateRep{id, charged});
}

OpResult op_array_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  auto array = session.objects.take<ArrayObj>(req.handle);
  if (!array) return call.done(CUDA_ERROR_INVALID_HANDLE);
  // A level of a mipmapped array: the handle goes, the level stays its mipmapped array's (the
  // driver answers success here too).
  if (array->mipmap != 0) return call.done();
  session.charge.release(array->charged);
  drop_tile_pools(session, array->tile_pools);
  Retired bundle;
  bundle.arrays.push_back(array->array);
  return call.done(retire(session, std::move(bundle)));
}

OpResult op_tex_object_create(Call& call) {
  auto req = call.request<proto::TexObjectCreateReq>();
  if (call.session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  CUDA_RESOURCE_DESC resource;
  if (CUresult r = resolve_resource(call, req.resource, resource); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUDA_TEXTURE_DESC texture{};
  const proto::WireTextureDesc& t = req.texture;
  for (int i = 0; i < 3; ++i)
    texture.addressMode[i] = static_cast<CUaddress_mode>(t.address_mode[i]);
  texture.filterMode = static_cast<CUfilter_mode>(t.filter_mode);
  texture.flags = t.flags;
  texture.maxAnisotropy = t.max_anisotropy;
  texture.mipmapFilterMode = static_cast<CUfilter_mode>(t.mipmap_filter_mode);
  texture.mipmapLevelBias = t.mipmap_level_bias;
  texture.minMipmapLevelClamp = t.min_mipmap_level_clamp;
  texture.maxMipmapLevelClamp = t.max_mipmap_level_clamp;
  std::copy(std::begin(t.border_color), std::end(t.border_color), texture.borderColor);
  CUDA_RESOURCE_VIEW_DESC view{};
  const proto::WireResourceViewDesc& v = req.view;
  if (v.present != 0) {
    view.format = static_cast<CUresourceViewFormat>(v.format);
    view.width = v.width;
    view.height = v.height;
    view.depth = v.depth;
    view.firstMipmapLevel = v.first_mipmap_level;
    view.lastMipmapLevel = v.last_mipmap_level;
    view.firstLayer = v.first_layer;
    view.lastLayer = v.last_layer;
  }
  CUtexObject value = 0;
  CUresult r =
      call.cu.cuTexObjectCreate(&value, &resource, &texture, v.present != 0 ? &view : nullptr);
  return finish_object(call, r, value, false, req.ctx);
}

OpResult op_tex_object_destroy(Call& call) {
  return destroy_object(call, false);
}

OpResult op_surf_object_create(Call& call) {
  auto req = call.request<proto::SurfObjectCreateReq>();
  if (call.session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  CUDA_RESOURCE_DESC resource;
  if (CUresult r = resolve_resource(call, req.resource, resource); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUsurfObject value = 0;
  CUresult r = call.cu.cuSurfObjectCreate(&value, &resource);
  return finish_object(call, r, value, true, req.ctx);
}

OpResult op_surf_object_destroy(Call& call) {
  return destroy_object(call, true);
}

}  // namespace mpsshim::server

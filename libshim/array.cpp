// CUDA arrays and texture/surface objects. Both live on the server; a CUarray is our Array
// object (the descriptor is answered here), a CUtexObject/CUsurfObject is the driver's own value,
// since kernels take it as an argument. The shim remembers each object's descriptors to answer
// the Get*Desc calls without a round trip.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/array_wire.hpp"
#include "libshim/client.hpp"
#include "libshim/object_pool.hpp"
#include "proto/ops_copies.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

CUresult create_array(const CUDA_ARRAY3D_DESCRIPTOR& desc, CUarray* out) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ArrayCreateReq request{ctx->wire, wire_descriptor(desc)};
  proto::ArrayCreateRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kArrayCreate, request, &reply);
  if (rc == CUDA_ERROR_NOT_SUPPORTED) log_unsupported_array("cuArrayCreate", desc);
  if (rc != CUDA_SUCCESS) return rc;
  Array* array = nullptr;
  try {
    array = ObjectPool<Array>::instance().make(Magic::kArray, ctx, reply.array, desc);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = reinterpret_cast<CUarray>(array);
  return CUDA_SUCCESS;
}

}  // namespace

void mpsshim::shim::log_unsupported_array(const char* call,
                                          const CUDA_ARRAY3D_DESCRIPTOR& d) noexcept {
  log_once(call, LogLevel::kWarn,
           "{}: an array of format {:#x} with {} channel(s) and flags {:#x} is not supported by "
           "mpsshim (plain 8/16/32-bit, half and float formats only; no "
           "deferred-mapping arrays); returning CUDA_ERROR_NOT_SUPPORTED",
           call, static_cast<unsigned>(d.Format), d.NumChannels, d.Flags);
}

namespace {

// ---- texture and surface objects ----

struct TexRecord {
  Session* session;
  proto::WireHandle wire;
  bool surface;
  CUDA_RESOURCE_DESC resource;
  CUDA_TEXTURE_DESC texture;
  bool has_view;
  CUDA_RESOURCE_VIEW_DESC view;
};

struct TexRegistry {
  std::mutex mutex;
  // Texture and surface values may come from separate counters: keyed by both.
  std::map<std::pair<unsigned long long, bool>, TexRecord> objects;
};
TexRegistry& registry() {
  static TexRegistry* r = new TexRegistry();  // never destroyed: used from static destructors
  return *r;
}

CUresult wire_resource(const CUDA_RESOURCE_DESC* r, Context* ctx, proto::WireResourceDesc& out) {
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  out = proto::WireResourceDesc{
      static_cast<std::uint32_t>(r->resType), r->flags, 0, 0, 0, 0, 0, 0, 0};
  switch (r->resType) {
    case CU_RESOURCE_TYPE_ARRAY: {
      Array* array = object_of<Array>(r->res.array.hArray);
      if (array == nullptr || array->ctx->session != ctx->session) return CUDA_ERROR_INVALID_HANDLE;
      out.handle = array->wire;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      MipmappedArray* mipmap = object_of<MipmappedArray>(r->res.mipmap.hMipmappedArray);
      if (mipmap == nullptr || mipmap->ctx->session != ctx->session) {
        return CUDA_ERROR_INVALID_HANDLE;
      }
      out.handle = mipmap->wire;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_LINEAR:
      out.handle = r->res.linear.devPtr;
      out.format = static_cast<std::uint32_t>(r->res.linear.format);
      out.channels = r->res.linear.numChannels;
      out.size_bytes = r->res.linear.sizeInBytes;
      return CUDA_SUCCESS;
    case CU_RESOURCE_TYPE_PITCH2D:
      out.handle = r->res.pitch2D.devPtr;
      out.format = static_cast<std::uint32_t>(r->res.pitch2D.format);
      out.channels = r->res.pitch2D.numChannels;
      out.width = r->res.pitch2D.width;
      out.height = r->res.pitch2D.height;
      out.pitch = r->res.pitch2D.pitchInBytes;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult remember(unsigned long long value, const TexRecord& record) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  try {
    r.objects[{value, record.surface}] = record;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

bool find(unsigned long long value, bool surface, TexRecord& out) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.objects.find({value, surface});
  if (it == r.objects.end()) return false;
  out = it->second;
  return true;
}

CUresult destroy_object(unsigned long long value, bool surface) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  TexRecord record{};
  {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.objects.find({value, surface});
    if (it == r.objects.end()) return CUDA_ERROR_INVALID_VALUE;
    record = it->second;
    r.objects.erase(it);
  }
  proto::Op op = surface ? proto::Op::kSurfObjectDestroy : proto::Op::kTexObjectDestroy;
  return record.session->call(op, proto::HandleReq{record.wire}, static_cast<int*>(nullptr));
}

}  // namespace

// ---- arrays ----

MPSSHIM_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray* out, const CUDA_ARRAY_DESCRIPTOR* d) {
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = d->Width;
  desc.Height = d->Height;
  desc.Format = d->Format;
  desc.NumChannels = d->NumChannels;
  return create_array(desc, out);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return create_array(*d, out);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Array* array = object_of<Array>(handle);
  if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult rc = array->ctx->session->call(proto::Op::kArrayDestroy, proto::HandleReq{array->wire},
                                          static_cast<int*>(nullptr));
  if (rc != CUDA_SUCCESS) return rc;
  // A level's handle: its mipmapped array hands out a new one if asked again.
  if (MipmappedArray* mipmap = array->level_of) {
    std::lock_guard lock(mipmap->mutex);
    std::replace(mipmap->given.begin(), mipmap->given.end(), array, static_cast<Array*>(nullptr));
  }
  // Back to its pool: a stale handle reads as dead (or as a newer array), never freed memory.
  ObjectPool<Array>::instance().retire(array);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* out,
                                                          CUarray handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Array* array = object_of<Array>(handle);
  if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = array->desc;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* out,
                                                        CUarray handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Array* array = object_of<Array>(handle);
  if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (array->desc.Depth != 0)
    return CUDA_ERROR_INVALID_VALUE;  // a 3D array: cuArray3DGetDescriptor
  out->Width = array->desc.Width;
  out->Height = array->desc.Height;
  out->Format = array->desc.Format;
  out->NumChannels = array->desc.NumChannels;
  return CUDA_SUCCESS;
}

// ---- texture and surface objects ----

// The planes of a planar video array (NV12 and the like). mpsshim makes no array of a planar
// format (they are refused at creation), and an H200's driver makes none either; of every other
// array the driver answers CUDA_ERROR_INVALID_VALUE, as here
// (tools/probes/array_planes_sparse.cpp).
MPSSHIM_EXPORT CUresult CUDAAPI cuArrayGetPlane(CUarray* plane, CUarray handle, unsigned int) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (object_of<Array>(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (plane == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_VALUE;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTexObjectCreate(CUtexObject* out,
                                                  const CUDA_RESOURCE_DESC* resource,
                                                  const CUDA_TEXTURE_DESC* texture,
                                                  const CUDA_RESOURCE_VIEW_DESC* view) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || texture == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::TexObjectCreateReq request{};
  request.ctx = ctx->wire;
  if (CUresult rc = wire_resource(resource, ctx, request.resource); rc != CUDA_SUCCESS) return rc;
  proto::WireTextureDesc& t = request.texture;
  for (int i = 0; i < 3; ++i)
    t.address_mode[i] = static_cast<std::uint32_t>(texture->addressMode[i]);
  t.filter_mode = static_cast<std::uint32_t>(texture->filterMode);
  t.flags = texture->flags;
  t.max_anisotropy = texture->maxAnisotropy;
  t.mipmap_filter_mode = static_cast<std::uint32_t>(texture->mipmapFilterMode);
  t.mipmap_level_bias = texture->mipmapLevelBias;
  t.min_mipmap_level_clamp = texture->minMipmapLevelClamp;
  t.max_mipmap_level_clamp = texture->maxMipmapLevelClamp;
  for (int i = 0; i < 4; ++i) t.border_color[i] = texture->borderColor[i];
  if (view != nullptr) {
    request.view = proto::WireResourceViewDesc{1,
                                               static_cast<std::uint32_t>(view->format),
                                               view->width,
                                               view->height,
                                               view->depth,
                                               view->firstMipmapLevel,
                                               view->lastMipmapLevel,
                                               view->firstLayer,
                                               view->lastLayer};
  }
  proto::TexObjectRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kTexObjectCreate, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  TexRecord record{ctx->session,
                   reply.object,
                   false,
                   *resource,
                   *texture,
                   view != nullptr,
                   view ? *view : CUDA_RESOURCE_VIEW_DESC{}};
  if (CUresult r = remember(reply.value, record); r != CUDA_SUCCESS) return r;
  *out = reply.value;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTexObjectDestroy(CUtexObject value) {
  return destroy_object(value, false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* out,
                                                           CUtexObject value) {
  TexRecord record{};
  if (out == nullptr || !find(value, false, record)) return CUDA_ERROR_INVALID_VALUE;
  *out = record.resource;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* out,
                                                          CUtexObject value) {
  TexRecord record{};
  if (out == nullptr || !find(value, false, record)) return CUDA_ERROR_INVALID_VALUE;
  *out = record.texture;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* out,
                                                               CUtexObject value) {
  TexRecord record{};
  if (out == nullptr || !find(value, false, record) || !record.has_view) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = record.view;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuSurfObjectCreate(CUsurfObject* out,
                                                   const CUDA_RESOURCE_DESC* resource) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::SurfObjectCreateReq request{};
  request.ctx = ctx->wire;
  if (CUresult rc = wire_resource(resource, ctx, request.resource); rc != CUDA_SUCCESS) return rc;
  proto::TexObjectRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kSurfObjectCreate, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  TexRecord record{ctx->session, reply.object, true, *resource, {}, false, {}};
  if (CUresult r = remember(reply.value, record); r != CUDA_SUCCESS) return r;
  *out = reply.value;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuSurfObjectDestroy(CUsurfObject value) {
  return destroy_object(value, true);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* out,
                                                            CUsurfObject value) {
  TexRecord record{};
  if (out == nullptr || !find(value, true, record)) return CUDA_ERROR_INVALID_VALUE;
  *out = record.resource;
  return CUDA_SUCCESS;
}

// Mipmapped arrays (docs/copies.md): made by the server's driver; each level is handed out as a
// CUDA array of this process (the same handle each time it is asked for), which copies, texture
// and surface objects take like any array. Texture objects may sample the whole mipmapped array
// (CU_RESOURCE_TYPE_MIPMAPPED_ARRAY, array.cpp).
#include <algorithm>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/array_wire.hpp"
#include "libshim/client.hpp"
#include "libshim/object_pool.hpp"
#include "proto/ops_copies.hpp"
#include "proto/ops_driver_extras.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

CUresult query(CUmipmappedArray handle, proto::ArrayQuery what, proto::ArrayQueryRep& reply) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MipmappedArray* mipmap = object_of<MipmappedArray>(handle);
  if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return mipmap->ctx->session->call(
      proto::Op::kArrayQuery,
      proto::ArrayQueryReq{mipmap->wire, static_cast<std::uint32_t>(what), 1}, &reply);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* out,
                                                       const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                                       unsigned int levels) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ArrayCreateReq request{ctx->wire, wire_descriptor(*desc, levels)};
  proto::ArrayCreateRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kMipmappedArrayCreate, request, &reply);
  if (rc == CUDA_ERROR_NOT_SUPPORTED) log_unsupported_array("cuMipmappedArrayCreate", *desc);
  if (rc != CUDA_SUCCESS) return rc;
  MipmappedArray* mipmap = nullptr;
  try {
    mipmap = ObjectPool<MipmappedArray>::instance().make(Magic::kMipmappedArray, ctx, reply.array,
                                                         *desc, levels);
    mipmap->given.assign(levels, nullptr);
  } catch (...) {
    ctx->session->post(proto::Op::kMipmappedArrayDestroy, proto::HandleReq{reply.array});
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = reinterpret_cast<CUmipmappedArray>(mipmap);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMipmappedArrayGetLevel(CUarray* out, CUmipmappedArray handle,
                                                         unsigned int level) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MipmappedArray* mipmap = object_of<MipmappedArray>(handle);
  if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr || level >= mipmap->levels) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mipmap->mutex);
  if (Array* given = mipmap->given[level]) {
    *out = reinterpret_cast<CUarray>(given);
    return CUDA_SUCCESS;
  }
  proto::ArrayLevelRep reply{};
  if (CUresult rc = mipmap->ctx->session->call(
          proto::Op::kMipmappedArrayLevel, proto::ArrayLevelReq{mipmap->wire, level, 0}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  Array* array = nullptr;
  try {
    array = ObjectPool<Array>::instance().make(Magic::kArray, mipmap->ctx, reply.array,
                                               driver_descriptor(reply.desc), mipmap);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  mipmap->given[level] = array;
  *out = reinterpret_cast<CUarray>(array);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MipmappedArray* mipmap = object_of<MipmappedArray>(handle);
  if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult rc =
      mipmap->ctx->session->call(proto::Op::kMipmappedArrayDestroy, proto::HandleReq{mipmap->wire},
                                 static_cast<int*>(nullptr));
  if (rc != CUDA_SUCCESS) return rc;
  {
    std::lock_guard lock(mipmap->mutex);
    for (Array* level : mipmap->given) {
      if (level != nullptr) ObjectPool<Array>::instance().retire(level);
    }
    mipmap->given.clear();
  }
  ObjectPool<MipmappedArray>::instance().retire(mipmap);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI
cuMipmappedArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUmipmappedArray handle) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ArrayQueryRep reply{};
  if (CUresult rc = query(handle, proto::ArrayQuery::kSparseProperties, reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = sparse_properties(reply);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS* out, CUmipmappedArray handle, CUdevice device) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MipmappedArray* mipmap = object_of<MipmappedArray>(handle);
  if (mipmap != nullptr && mipmap->ctx->device != device) return CUDA_ERROR_INVALID_DEVICE;
  proto::ArrayQueryRep reply{};
  if (CUresult rc = query(handle, proto::ArrayQuery::kMemoryRequirements, reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = memory_requirements(reply);
  return CUDA_SUCCESS;
}

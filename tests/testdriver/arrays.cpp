// CUDA arrays, 2D/3D copies and texture/surface objects. An array is a device allocation of its
// own with rows packed (pitch = width * element size), so copies and texture fetches reach it as
// they reach linear memory. Texture objects are numbered from 1, as the real driver's are.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"
#include "tests/testdriver/texture.hpp"

namespace mpsshim::testdriver {

std::size_t channel_bytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 0;
  }
}

namespace {

__extension__ using u128 = unsigned __int128;

// One side of a copy: rows at base + (z * height + y) * pitch + x. `direct`: pageable host
// memory, used in place (the call then waits for the copy).
struct Side {
  std::uintptr_t base = 0;
  std::size_t pitch = 0;
  std::size_t height = 0;
  std::size_t x = 0, y = 0, z = 0;
  bool direct = false;
  std::uintptr_t row(std::size_t dy, std::size_t dz) const {
    return base + ((z + dz) * height + y + dy) * pitch + x;
  }
};

CUresult make_side(State& s, CUmemorytype type, const void* host, CUdeviceptr device, CUarray array,
                   std::size_t pitch, std::size_t height, std::size_t x, std::size_t y,
                   std::size_t z, const CUDA_MEMCPY3D& c, Side& out) {
  out = Side{0, pitch, height, x, y, z, false};
  if (type == CU_MEMORYTYPE_ARRAY) {
    Array* a = s.arrays.get(array);
    if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (x % a->element != 0 || u128{x} + c.WidthInBytes > a->row() ||
        u128{y} + c.Height > a->rows() || u128{z} + c.Depth > a->slices()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    out.base = a->storage;
    out.pitch = a->row();
    out.height = a->rows();
    return CUDA_SUCCESS;
  }
  if (pitch < c.WidthInBytes + x && (c.Height > 1 || c.Depth > 1)) return CUDA_ERROR_INVALID_VALUE;
  if (c.Depth > 1 && height < c.Height + y) return CUDA_ERROR_INVALID_VALUE;
  const u128 first = (u128{z} * height + y) * pitch + x;
  const u128 end =
      ((u128{z} + c.Depth - 1) * height + y + c.Height - 1) * pitch + x + c.WidthInBytes;
  std::uintptr_t base = 0;
  switch (type) {
    case CU_MEMORYTYPE_DEVICE:
      base = device;
      break;
    case CU_MEMORYTYPE_HOST:
      if (host == nullptr) return CUDA_ERROR_INVALID_VALUE;
      base = reinterpret_cast<std::uintptr_t>(host);
      break;
    case CU_MEMORYTYPE_UNIFIED:
      base = device;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (u128{base} + end > ~std::uintptr_t{0}) return CUDA_ERROR_INVALID_VALUE;
  out.base = base;
  const auto extent = static_cast<std::size_t>(end - first);
  if (resolve_range_locked(s, base + static_cast<std::size_t>(first), extent) != nullptr) {
    return CUDA_SUCCESS;
  }
  // Not device memory nor registered: pageable host memory, if the side may be host memory.
  if (type == CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  out.direct = true;
  return CUDA_SUCCESS;
}

std::byte* at(const Side& side, std::uintptr_t address, std::size_t bytes) {
  if (side.direct) return reinterpret_cast<std::byte*>(address);
  std::byte* p = resolve_range(address, bytes);
  if (p == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
  return p;
}

CUresult check_resource(State& s, const CUDA_RESOURCE_DESC& r) {
  switch (r.resType) {
    case CU_RESOURCE_TYPE_ARRAY:
      return s.arrays.get(r.res.array.hArray) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      return s.mipmaps.get(r.res.mipmap.hMipmappedArray) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    case CU_RESOURCE_TYPE_LINEAR:
      return resolve_range_locked(s, r.res.linear.devPtr, r.res.linear.sizeInBytes)
                 ? CUDA_SUCCESS
                 : CUDA_ERROR_INVALID_VALUE;
    case CU_RESOURCE_TYPE_PITCH2D: {
      const auto& p = r.res.pitch2D;
      const std::size_t element = channel_bytes(p.format) * p.numChannels;
      if (element == 0 || p.width == 0 || p.height == 0 || p.pitchInBytes < p.width * element)
        return CUDA_ERROR_INVALID_VALUE;
      const std::size_t extent = (p.height - 1) * p.pitchInBytes + p.width * element;
      return resolve_range_locked(s, p.devPtr, extent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult create_object(const CUDA_RESOURCE_DESC* resource, const CUDA_TEXTURE_DESC* texture,
                       bool surface, unsigned long long* out) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (current_device(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (out == nullptr || resource == nullptr || (!surface && texture == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    if (surface && resource->resType != CU_RESOURCE_TYPE_ARRAY) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_resource(s, *resource); r != CUDA_SUCCESS) return r;
    const unsigned long long value = s.next_tex_object++;
    s.tex_objects[value] = TexObject{*resource, texture ? *texture : CUDA_TEXTURE_DESC{}, surface};
    *out = value;
    return CUDA_SUCCESS;
  });
}

CUresult destroy_object(unsigned long long value, bool surface) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    auto it = s.tex_objects.find(value);
    if (it == s.tex_objects.end() || it->second.surface != surface) return CUDA_ERROR_INVALID_VALUE;
    s.tex_objects.erase(it);
    return CUDA_SUCCESS;
  });
}

}  // namespace

float fetch_texel_f32(unsigned long long tex, long x, long y) {
  State& s = state();
  CUDA_RESOURCE_DESC r;
  std::uintptr_t base = 0;
  std::size_t pitch = 0, width = 0, height = 0;
  {
    std::lock_guard lock(s.mutex);
    auto it = s.tex_objects.find(tex);
    if (it == s.tex_objects.end() || it->second.surface)
      throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
    r = it->second.resource;
    if (r.resType == CU_RESOURCE_TYPE_PITCH2D) {
      if (r.res.pitch2D.format != CU_AD_FORMAT_FLOAT || r.res.pitch2D.numChannels != 1)
        throw DeviceFault{CUDA_ERROR_ILLEGAL_INSTRUCTION};
      base = r.res.pitch2D.devPtr;
      pitch = r.res.pitch2D.pitchInBytes;
      width = r.res.pitch2D.width;
      height = r.res.pitch2D.height;
    } else if (r.resType == CU_RESOURCE_TYPE_ARRAY ||
               r.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
      // A mipmapped array is fetched from its level 0 (tex2D, no level of detail).
      Array* a = nullptr;
      if (r.resType == CU_RESOURCE_TYPE_ARRAY) {
        a = s.arrays.get(r.res.array.hArray);
      } else if (MipmappedArray* m = s.mipmaps.get(r.res.mipmap.hMipmappedArray)) {
        a = s.arrays.get(m->levels.front());
      }
      if (a == nullptr || a->desc.Format != CU_AD_FORMAT_FLOAT || a->desc.NumChannels != 1)
        throw DeviceFault{CUDA_ERROR_ILLEGAL_INSTRUCTION};
      base = a->storage;
      pitch = a->row();
      width = a->desc.Width;
      height = a->rows();
    } else {
      throw DeviceFault{CUDA_ERROR_ILLEGAL_INSTRUCTION};
    }
  }
  // Clamp addressing, point filtering, unnormalized coordinates.
  const std::size_t cx =
      static_cast<std::size_t>(std::clamp<long>(x, 0, static_cast<long>(width) - 1));
  const std::size_t cy =
      static_cast<std::size_t>(std::clamp<long>(y, 0, static_cast<long>(height) - 1));
  std::byte* p = resolve_range(base + cy * pitch + cx * sizeof(float), sizeof(float));
  if (p == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray* out,
                                                              const CUDA_ARRAY3D_DESCRIPTOR* d) {
  return entry([&](State& s) {
    if (inject_failure("cuArray3DCreate_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (out == nullptr || d == nullptr || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
    if (d->Depth != 0 && d->Height == 0) return CUDA_ERROR_INVALID_VALUE;
    // Sparse arrays are 2D, 2D layered or 3D (cuda.h, cuMemMapArrayAsync).
    if ((d->Flags & CUDA_ARRAY3D_SPARSE) != 0 && d->Height == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t element = channel_bytes(d->Format) * d->NumChannels;
    if (element == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
      return CUDA_ERROR_INVALID_VALUE;
    auto array = std::make_shared<Array>(Array{dev->ordinal, 0, *d, element});
    const u128 bytes = u128{array->row()} * array->rows() * array->slices();
    if (bytes > SIZE_MAX / 2) return CUDA_ERROR_OUT_OF_MEMORY;
    if (CUresult r = allocate(s, *dev, static_cast<std::size_t>(bytes), false, &array->storage);
        r != CUDA_SUCCESS)
      return r;
    *out = s.arrays.add(std::move(array));
    return CUDA_SUCCESS;
  });
}

// Like cuMemFree: waits for queued work, then releases the storage with nothing running.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray handle) {
  return entry([&](State& s) {
    {
      std::lock_guard lock(s.mutex);
      if (s.arrays.get(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    }
    drain(s, -1);
    std::unique_lock use(s.memory_use);
    std::lock_guard lock(s.mutex);
    Array* array = s.arrays.get(handle);
    if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // A level stays its mipmapped array's (the real driver answers success: H200, driver 580).
    if (array->level_of != nullptr) return CUDA_SUCCESS;
    unmap_tiles(s, *array);
    release_allocation(s, array->storage);
    s.arrays.erase(handle);
    return CUDA_SUCCESS;
  });
}

// Each level halves width, height and (unless layered) depth, down to 1; more levels than the
// largest extent halves to 1 in are CUDA_ERROR_INVALID_VALUE, as natively.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* out,
                                                                  const CUDA_ARRAY3D_DESCRIPTOR* d,
                                                                  unsigned int levels) {
  return entry([&](State& s) {
    if (inject_failure("cuMipmappedArrayCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (out == nullptr || d == nullptr || d->Width == 0 || levels == 0 ||
        ((d->Flags & CUDA_ARRAY3D_SPARSE) != 0 && d->Height == 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const bool layered = (d->Flags & CUDA_ARRAY3D_LAYERED) != 0;
    std::size_t largest = std::max<std::size_t>(d->Width, d->Height);
    if (!layered) largest = std::max<std::size_t>(largest, d->Depth);
    unsigned possible = 1;
    while ((largest >> possible) != 0) ++possible;
    if (levels > possible) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t element = channel_bytes(d->Format) * d->NumChannels;
    if (element == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
      return CUDA_ERROR_INVALID_VALUE;
    auto mipmap = std::make_shared<MipmappedArray>(MipmappedArray{dev->ordinal, *d, {}});
    const CUmipmappedArray handle = reinterpret_cast<CUmipmappedArray>(mipmap.get());
    for (unsigned l = 0; l < levels; ++l) {
      CUDA_ARRAY3D_DESCRIPTOR level = *d;
      level.Width = std::max<std::size_t>(d->Width >> l, 1);
      if (d->Height != 0) level.Height = std::max<std::size_t>(d->Height >> l, 1);
      if (d->Depth != 0 && !layered) level.Depth = std::max<std::size_t>(d->Depth >> l, 1);
      auto array = std::make_shared<Array>(Array{dev->ordinal, 0, level, element, handle});
      const u128 bytes = u128{array->row()} * array->rows() * array->slices();
      CUresult r = bytes > SIZE_MAX / 2
                       ? CUDA_ERROR_OUT_OF_MEMORY
                       : allocate(s, *dev, static_cast<std::size_t>(bytes), false, &array->storage);
      if (r != CUDA_SUCCESS) {
        for (CUarray made : mipmap->levels) {
          release_allocation(s, s.arrays.get(made)->storage);
          s.arrays.erase(made);
        }
        return r;
      }
      mipmap->levels.push_back(s.arrays.add(std::move(array)));
    }
    *out = s.mipmaps.add(std::move(mipmap));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMipmappedArrayGetLevel(CUarray* out,
                                                                    CUmipmappedArray handle,
                                                                    unsigned int level) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    MipmappedArray* mipmap = s.mipmaps.get(handle);
    if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (out == nullptr || level >= mipmap->levels.size()) return CUDA_ERROR_INVALID_VALUE;
    *out = mipmap->levels[level];
    return CUDA_SUCCESS;
  });
}

// Like cuArrayDestroy: waits for queued work, then releases every level.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  return entry([&](State& s) {
    {
      std::lock_guard lock(s.mutex);
      if (s.mipmaps.get(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    }
    drain(s, -1);
    std::unique_lock use(s.memory_use);
    std::lock_guard lock(s.mutex);
    MipmappedArray* mipmap = s.mipmaps.get(handle);
    if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    for (CUarray level : mipmap->levels) {
      if (Array* array = s.arrays.get(level)) {
        unmap_tiles(s, *array);
        release_allocation(s, array->storage);
      }
      s.arrays.erase(level);
    }
    s.mipmaps.erase(handle);
    return CUDA_SUCCESS;
  });
}

// Only deferred-mapping arrays have these; the test driver makes none, and the real driver
// answers CUDA_ERROR_INVALID_VALUE for the others (H200, driver 580).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS* out, CUmipmappedArray handle, CUdevice) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (s.mipmaps.get(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    (void)out;
    return CUDA_ERROR_INVALID_VALUE;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* out,
                                                                     CUarray handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Array* array = s.arrays.get(handle);
    if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *out = array->desc;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* c,
                                                              CUstream hstream) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (c->WidthInBytes == 0 || c->Height == 0 || c->Depth == 0) return CUDA_SUCCESS;
    Side src, dst;
    if (CUresult r =
            make_side(s, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch,
                      c->srcHeight, c->srcXInBytes, c->srcY, c->srcZ, *c, src);
        r != CUDA_SUCCESS)
      return r;
    if (CUresult r =
            make_side(s, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch,
                      c->dstHeight, c->dstXInBytes, c->dstY, c->dstZ, *c, dst);
        r != CUDA_SUCCESS)
      return r;
    const std::size_t width = c->WidthInBytes, height = c->Height, depth = c->Depth;
    const WorkQueue::Ticket ticket = submit_work(s, *stream, [=] {
      for (std::size_t z = 0; z < depth; ++z) {
        for (std::size_t y = 0; y < height; ++y) {
          std::memmove(at(dst, dst.row(y, z), width), at(src, src.row(y, z), width), width);
        }
      }
    });
    if (!src.direct && !dst.direct) return CUDA_SUCCESS;
    std::shared_ptr<WorkQueue> queue = stream->queue;
    lock.unlock();
    queue->wait(ticket);
    return s.sticky.load();
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuTexObjectCreate(CUtexObject* out,
                                                             const CUDA_RESOURCE_DESC* resource,
                                                             const CUDA_TEXTURE_DESC* texture,
                                                             const CUDA_RESOURCE_VIEW_DESC*) {
  return create_object(resource, texture, false, out);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuTexObjectDestroy(CUtexObject value) {
  return destroy_object(value, false);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuSurfObjectCreate(CUsurfObject* out,
                                                              const CUDA_RESOURCE_DESC* resource) {
  return create_object(resource, nullptr, true, out);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuSurfObjectDestroy(CUsurfObject value) {
  return destroy_object(value, true);
}

// The fake's 2D/3D copies (done at once, byte by byte), arrays (host bytes, rows packed) and
// texture/surface objects (counted).
#include <cstring>

#include "tests/server/fake_driver.hpp"

namespace mpsshim::server::test {
namespace {

std::size_t element_of(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  std::size_t channel =
      d.Format == CU_AD_FORMAT_FLOAT || d.Format == CU_AD_FORMAT_UNSIGNED_INT32 ||
              d.Format == CU_AD_FORMAT_SIGNED_INT32
          ? 4
      : d.Format == CU_AD_FORMAT_UNSIGNED_INT8 || d.Format == CU_AD_FORMAT_SIGNED_INT8 ? 1
                                                                                       : 2;
  return channel * d.NumChannels;
}

struct FakeArray {
  CUDA_ARRAY3D_DESCRIPTOR desc;
};
std::map<CUarray, FakeArray>& descriptors() {
  static std::map<CUarray, FakeArray> d;
  return d;
}

std::byte* address(CUmemorytype type, const void* host, CUdeviceptr device, CUarray array,
                   std::size_t pitch, std::size_t height, std::size_t x, std::size_t y,
                   std::size_t z) {
  if (type == CU_MEMORYTYPE_ARRAY) {
    const CUDA_ARRAY3D_DESCRIPTOR& d = descriptors().at(array).desc;
    std::size_t row = d.Width * element_of(d);
    std::size_t rows = d.Height == 0 ? 1 : d.Height;
    return fake_gpu().arrays.at(array).data() + (z * rows + y) * row + x;
  }
  auto* base = type == CU_MEMORYTYPE_HOST ? static_cast<std::byte*>(const_cast<void*>(host))
                                          : reinterpret_cast<std::byte*>(device);
  return base + (z * height + y) * pitch + x;
}

}  // namespace

void add_copy_fakes(DriverTable& t) {
  t.cuMemcpy3DAsync_v2 = [](const CUDA_MEMCPY3D* c, CUstream) {
    ++fake_gpu().copies_3d;
    for (std::size_t z = 0; z < c->Depth; ++z) {
      for (std::size_t y = 0; y < c->Height; ++y) {
        std::byte* from =
            address(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch,
                    c->srcHeight, c->srcXInBytes, c->srcY + y, c->srcZ + z);
        std::byte* to =
            address(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch,
                    c->dstHeight, c->dstXInBytes, c->dstY + y, c->dstZ + z);
        std::memmove(to, from, c->WidthInBytes);
      }
    }
    return CUDA_SUCCESS;
  };
  t.cuArray3DCreate_v2 = [](CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR* d) {
    static std::uintptr_t next = 0xa000;
    next += 0x10;
    auto array = reinterpret_cast<CUarray>(next);
    std::size_t bytes =
        d->Width * element_of(*d) * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1);
    fake_gpu().arrays[array].assign(bytes, std::byte{0});
    descriptors()[array] = FakeArray{*d};
    ++fake_gpu().arrays_live;
    *out = array;
    return CUDA_SUCCESS;
  };
  t.cuArrayDestroy = [](CUarray a) {
    if (fake_gpu().arrays.erase(a) == 0) return CUDA_ERROR_INVALID_HANDLE;
    descriptors().erase(a);
    --fake_gpu().arrays_live;
    return CUDA_SUCCESS;
  };
  t.cuTexObjectCreate = [](CUtexObject* out, const CUDA_RESOURCE_DESC*, const CUDA_TEXTURE_DESC*,
                           const CUDA_RESOURCE_VIEW_DESC*) {
    static CUtexObject next = 0;
    *out = ++next;
    ++fake_gpu().tex_objects_live;
    return CUDA_SUCCESS;
  };
  t.cuTexObjectDestroy = [](CUtexObject) {
    --fake_gpu().tex_objects_live;
    return CUDA_SUCCESS;
  };
  t.cuSurfObjectCreate = [](CUsurfObject* out, const CUDA_RESOURCE_DESC*) {
    static CUsurfObject next = 1000;
    *out = ++next;
    ++fake_gpu().tex_objects_live;
    return CUDA_SUCCESS;
  };
  t.cuSurfObjectDestroy = [](CUsurfObject) {
    --fake_gpu().tex_objects_live;
    return CUDA_SUCCESS;
  };
}

}  // namespace mpsshim::server::test

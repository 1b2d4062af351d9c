// Black-box probe of the real driver, for serving cuArrayGetPlane and cuMemMapArrayAsync:
//
// 1. NV12 arrays (CU_AD_FORMAT_NV12): which channel counts cuArray3DCreate takes, what
//    cuArrayGetPlane answers for planes 0, 1, 2 (their descriptors), whether the same plane
//    twice is the same handle, whether a plane may be destroyed, copies into each plane.
// 2. Sparse arrays (CUDA_ARRAY3D_SPARSE): creation, sparse properties, a tile mapped onto a
//    physical allocation with cuMemMapArrayAsync, written and read back through copies, unmapped;
//    what a mapping past the array and a handle of the wrong kind answer.
//
// Build and run on the GPU machine (one line):
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/array_planes_sparse.cpp -lcuda
//     -o /tmp/array_planes_sparse && /tmp/array_planes_sparse
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "must.hpp"

namespace {

void show(const char* what, CUarray a) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  CUresult r = cuArray3DGetDescriptor(&d, a);
  std::printf("  %s: %s W %zu H %zu D %zu format 0x%x channels %u flags 0x%x\n", what, name(r),
              d.Width, d.Height, d.Depth, d.Format, d.NumChannels, d.Flags);
}

}  // namespace

int main() {
  const CUdevice dev = start_on_gpu0();

  std::printf("NV12\n");
  CUarray nv12 = nullptr;
  for (unsigned channels : {1u, 2u, 3u, 4u}) {
    CUDA_ARRAY3D_DESCRIPTOR d{};
    d.Width = 64;
    d.Height = 48;
    d.Format = CU_AD_FORMAT_NV12;
    d.NumChannels = channels;
    CUarray a = nullptr;
    CUresult r = cuArray3DCreate(&a, &d);
    std::printf("  cuArray3DCreate NV12 64x48 channels %u: %s\n", channels, name(r));
    if (r == CUDA_SUCCESS && nv12 == nullptr)
      nv12 = a;
    else if (r == CUDA_SUCCESS)
      cuArrayDestroy(a);
  }
  CUDA_ARRAY3D_DESCRIPTOR odd{};
  odd.Width = 63;
  odd.Height = 47;
  odd.Format = CU_AD_FORMAT_NV12;
  odd.NumChannels = 3;
  CUarray odd_array = nullptr;
  std::printf("  odd 63x47: %s\n", name(cuArray3DCreate(&odd_array, &odd)));
  if (nv12 != nullptr) {
    show("nv12", nv12);
    CUarray planes[3]{};
    for (unsigned p = 0; p < 3; ++p) {
      CUresult r = cuArrayGetPlane(&planes[p], nv12, p);
      std::printf("  plane %u: %s\n", p, name(r));
      if (r == CUDA_SUCCESS) show("plane", planes[p]);
    }
    CUarray again = nullptr;
    cuArrayGetPlane(&again, nv12, 0);
    std::printf("  plane 0 twice the same handle: %d\n", again == planes[0]);
    // Copies into each plane.
    std::vector<unsigned char> host(64 * 48, 7), back(64 * 48, 0);
    for (unsigned p = 0; p < 2; ++p) {
      CUDA_ARRAY3D_DESCRIPTOR d{};
      cuArray3DGetDescriptor(&d, planes[p]);
      const size_t row = d.Width * d.NumChannels;  // bytes (8-bit channels)
      CUDA_MEMCPY2D c{};
      c.srcMemoryType = CU_MEMORYTYPE_HOST;
      c.srcHost = host.data();
      c.srcPitch = row;
      c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
      c.dstArray = planes[p];
      c.WidthInBytes = row;
      c.Height = d.Height;
      CUresult r = cuMemcpy2D(&c);
      CUDA_MEMCPY2D b{};
      b.srcMemoryType = CU_MEMORYTYPE_ARRAY;
      b.srcArray = planes[p];
      b.dstMemoryType = CU_MEMORYTYPE_HOST;
      b.dstHost = back.data();
      b.dstPitch = row;
      b.WidthInBytes = row;
      b.Height = d.Height;
      CUresult r2 = cuMemcpy2D(&b);
      std::printf("  plane %u copy in %s out %s, equal %d\n", p, name(r), name(r2),
                  std::memcmp(host.data(), back.data(), row * d.Height) == 0);
    }
    CUDA_MEMCPY2D whole{};
    whole.srcMemoryType = CU_MEMORYTYPE_HOST;
    whole.srcHost = host.data();
    whole.srcPitch = 64;
    whole.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    whole.dstArray = nv12;
    whole.WidthInBytes = 64;
    whole.Height = 48;
    std::printf("  copy into the NV12 array itself: %s\n", name(cuMemcpy2D(&whole)));
    std::printf("  cuArrayDestroy(plane 1): %s\n", name(cuArrayDestroy(planes[1])));
    CUDA_ARRAY3D_DESCRIPTOR d{};
    std::printf("  plane 0 after: %s\n", name(cuArray3DGetDescriptor(&d, planes[0])));
    std::printf("  cuArrayDestroy(nv12): %s\n", name(cuArrayDestroy(nv12)));
    std::printf("  plane 0 after its array: %s\n", name(cuArray3DGetDescriptor(&d, planes[0])));
  }

  {
    CUDA_ARRAY3D_DESCRIPTOR plain{};
    plain.Width = 64;
    plain.Height = 64;
    plain.Format = CU_AD_FORMAT_FLOAT;
    plain.NumChannels = 1;
    CUarray plain_array = nullptr, plane = nullptr;
    MUST(cuArray3DCreate(&plain_array, &plain));
    std::printf("  plane 0 of a plain float array: %s\n",
                name(cuArrayGetPlane(&plane, plain_array, 0)));
    std::printf("  plane 1 of it: %s\n", name(cuArrayGetPlane(&plane, plain_array, 1)));
    std::printf("  NULL out: %s\n", name(cuArrayGetPlane(nullptr, plain_array, 0)));
    std::printf("  NULL array: %s\n", name(cuArrayGetPlane(&plane, nullptr, 0)));
    MUST(cuArrayDestroy(plain_array));
  }
  CUDA_ARRAY3D_DESCRIPTOR ycbcr{};
  ycbcr.Width = 64;
  ycbcr.Height = 48;
  ycbcr.NumChannels = 1;
  for (CUarray_format f : {CU_AD_FORMAT_NV12, CU_AD_FORMAT_NV16, CU_AD_FORMAT_P010,
                           CU_AD_FORMAT_P016, CU_AD_FORMAT_YUV444_8bit_SemiPlanar}) {
    for (unsigned ch : {1u, 2u, 3u}) {
      ycbcr.Format = f;
      ycbcr.NumChannels = ch;
      CUarray a = nullptr;
      CUresult rr = cuArray3DCreate(&a, &ycbcr);
      if (rr == CUDA_SUCCESS) {
        std::printf("  planar format 0x%x channels %u created\n", f, ch);
        cuArrayDestroy(a);
      }
      CUDA_ARRAY_DESCRIPTOR d2{};
      d2.Width = 64;
      d2.Height = 48;
      d2.Format = f;
      d2.NumChannels = ch;
      rr = cuArrayCreate(&a, &d2);
      if (rr == CUDA_SUCCESS) {
        std::printf("  planar format 0x%x channels %u created by cuArrayCreate\n", f, ch);
        cuArrayDestroy(a);
      }
    }
  }

  std::printf("sparse\n");
  CUDA_ARRAY3D_DESCRIPTOR sd{};
  sd.Width = 1024;
  sd.Height = 1024;
  sd.Format = CU_AD_FORMAT_FLOAT;
  sd.NumChannels = 1;
  sd.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray sparse = nullptr;
  CUresult r = cuArray3DCreate(&sparse, &sd);
  std::printf("  cuArray3DCreate sparse 1024x1024 float: %s\n", name(r));
  if (r != CUDA_SUCCESS) return 0;
  CUDA_ARRAY_SPARSE_PROPERTIES props{};
  MUST(cuArrayGetSparseProperties(&props, sparse));
  std::printf("  tile %u x %u x %u, miptail first level %u size %llu flags 0x%x\n",
              props.tileExtent.width, props.tileExtent.height, props.tileExtent.depth,
              props.miptailFirstLevel, static_cast<unsigned long long>(props.miptailSize),
              props.flags);
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  r = cuArrayGetMemoryRequirements(&req, sparse, dev);
  std::printf("  memory requirements: %s size %zu alignment %zu\n", name(r), req.size,
              req.alignment);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
  size_t granularity = 0;
  MUST(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle physical;
  MUST(cuMemCreate(&physical, granularity, &prop, 0));
  std::printf("  granularity %zu\n", granularity);
  CUstream stream;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUarrayMapInfo info{};
  info.resourceType = CU_RESOURCE_TYPE_ARRAY;
  info.resource.array = sparse;
  info.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
  info.subresource.sparseLevel.level = 0;
  info.subresource.sparseLevel.offsetX = 0;
  info.subresource.sparseLevel.offsetY = 0;
  info.subresource.sparseLevel.extentWidth = props.tileExtent.width;
  info.subresource.sparseLevel.extentHeight = props.tileExtent.height;
  info.subresource.sparseLevel.extentDepth = 1;
  info.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
  info.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  info.memHandle.memHandle = physical;
  info.offset = 0;
  info.deviceBitMask = 1;
  r = cuMemMapArrayAsync(&info, 1, stream);
  std::printf("  map one tile: %s; sync %s\n", name(r), name(cuStreamSynchronize(stream)));
  std::vector<float> tile(props.tileExtent.width * props.tileExtent.height, 2.5f),
      back(tile.size());
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = tile.data();
  c.srcPitch = props.tileExtent.width * sizeof(float);
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = sparse;
  c.WidthInBytes = props.tileExtent.width * sizeof(float);
  c.Height = props.tileExtent.height;
  CUresult in = cuMemcpy2D(&c);
  CUDA_MEMCPY2D b{};
  b.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  b.srcArray = sparse;
  b.dstMemoryType = CU_MEMORYTYPE_HOST;
  b.dstHost = back.data();
  b.dstPitch = c.srcPitch;
  b.WidthInBytes = c.WidthInBytes;
  b.Height = c.Height;
  CUresult out = cuMemcpy2D(&b);
  std::printf("  tile copy in %s out %s equal %d\n", name(in), name(out), tile == back);
  CUarrayMapInfo past = info;
  past.subresource.sparseLevel.offsetX = 1024;
  std::printf("  map past the array: %s\n", name(cuMemMapArrayAsync(&past, 1, stream)));
  CUarrayMapInfo offset = info;
  offset.offset = granularity;
  std::printf("  map at an offset past the physical allocation: %s\n",
              name(cuMemMapArrayAsync(&offset, 1, stream)));
  CUarrayMapInfo unmap = info;
  unmap.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
  unmap.memHandle.memHandle = 0;
  r = cuMemMapArrayAsync(&unmap, 1, stream);
  std::printf("  unmap: %s; sync %s\n", name(r), name(cuStreamSynchronize(stream)));
  std::printf("  copy after unmap: %s\n", name(cuMemcpy2D(&b)));
  CUarrayMapInfo miptail = info;
  miptail.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL;
  miptail.subresource.miptail.layer = 0;
  miptail.subresource.miptail.offset = 0;
  miptail.subresource.miptail.size = props.miptailSize;
  std::printf("  map the miptail: %s\n", name(cuMemMapArrayAsync(&miptail, 1, stream)));
  std::printf("  cuMemRelease while mapped? release: %s\n", name(cuMemRelease(physical)));
  std::printf("  cuArrayDestroy(sparse): %s\n", name(cuArrayDestroy(sparse)));
  std::printf("  sync: %s\n", name(cuStreamSynchronize(stream)));
  return 0;
}

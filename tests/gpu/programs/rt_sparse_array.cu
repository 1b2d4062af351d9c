// Sparse CUDA arrays: three 128 x 128 tiles of a 1024 x 1024 float array mapped onto a tile
// pool (cuMemCreate with CU_MEM_CREATE_USAGE_TILE_POOL) with cuMemMapArrayAsync, written by a
// copy, read by a kernel through a texture object and by a copy back, then unmapped; and what
// the driver answers for a pool made without the tile-pool usage, an offset that is not a
// tile's and the mip tail of an array without levels. Result fields equal natively and under
// mpsshim.
static const char* const kProgram = "rt_sparse_array";
#include <vector>

#include "rt_driver.cuh"

namespace {

constexpr unsigned kSide = 1024;

__global__ void sample(CUtexObject tex, const unsigned* xs, const unsigned* ys, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<float>(tex, xs[i] + 0.5f, ys[i] + 0.5f);
}

CUarrayMapInfo tiles(CUarray array, unsigned x, unsigned y, unsigned width, unsigned height,
                     CUmemGenericAllocationHandle pool, size_t offset, CUdevice device) {
  CUarrayMapInfo info{};
  info.resourceType = CU_RESOURCE_TYPE_ARRAY;
  info.resource.array = array;
  info.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
  info.subresource.sparseLevel.offsetX = x;
  info.subresource.sparseLevel.offsetY = y;
  info.subresource.sparseLevel.extentWidth = width;
  info.subresource.sparseLevel.extentHeight = height;
  info.subresource.sparseLevel.extentDepth = 1;
  info.memOperationType = pool != 0 ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
  info.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  info.memHandle.memHandle = pool;
  info.offset = offset;
  info.deviceBitMask = 1u << device;
  return info;
}

CUresult copy_box(CUarray array, float* host, unsigned x, unsigned y, unsigned w, unsigned h,
                  bool to_array) {
  CUDA_MEMCPY2D c{};
  if (to_array) {
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host;
    c.srcPitch = w * sizeof(float);
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = array;
    c.dstXInBytes = x * sizeof(float);
    c.dstY = y;
  } else {
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = array;
    c.srcXInBytes = x * sizeof(float);
    c.srcY = y;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = host;
    c.dstPitch = w * sizeof(float);
  }
  c.WidthInBytes = w * sizeof(float);
  c.Height = h;
  return cuMemcpy2D(&c);
}

}  // namespace

int main() {
  RT_CHECK(cudaFree(nullptr));
  CUdevice device{};
  CU_CHECK(cuCtxGetDevice(&device));
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = d.Height = kSide;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray array{};
  CU_CHECK(cuArray3DCreate(&array, &d));
  CUDA_ARRAY_SPARSE_PROPERTIES props{};
  CU_CHECK(cuArrayGetSparseProperties(&props, array));
  const unsigned tw = props.tileExtent.width, th = props.tileExtent.height;
  const size_t tile_bytes = size_t{tw} * th * sizeof(float);

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
  size_t granularity = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle pool{}, plain{};
  CU_CHECK(cuMemCreate(&pool, granularity, &prop, 0));
  CUmemAllocationProp plain_prop = prop;
  plain_prop.allocFlags.usage = 0;
  CU_CHECK(cuMemCreate(&plain, granularity, &plain_prop, 0));
  CUstream stream{};
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  // Two tiles side by side in the first tile row at the pool's second tile, one below at its
  // first; one call.
  CUarrayMapInfo map[2] = {tiles(array, tw, 0, 2 * tw, th, pool, tile_bytes, device),
                           tiles(array, 0, th, tw, th, pool, 0, device)};
  CU_CHECK(cuMemMapArrayAsync(map, 2, stream));
  CU_CHECK(cuStreamSynchronize(stream));

  // The refusals, each the driver's own answer.
  CUarrayMapInfo bad = tiles(array, 0, 0, tw, th, plain, 0, device);
  const CUresult plain_pool = cuMemMapArrayAsync(&bad, 1, stream);
  bad = tiles(array, tw / 2, 0, tw, th, pool, 0, device);
  const CUresult misaligned = cuMemMapArrayAsync(&bad, 1, stream);
  bad = tiles(array, 0, 0, tw, th, pool, 0, device);
  bad.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL;
  bad.subresource.miptail.offset = 0;
  bad.subresource.miptail.size = tile_bytes;
  const CUresult miptail = cuMemMapArrayAsync(&bad, 1, stream);
  CU_CHECK(cuStreamSynchronize(stream));

  // Each mapped box written with its own pattern and read back by a copy.
  struct Box {
    unsigned x, y, w, h;
  };
  const Box boxes[2] = {{tw, 0, 2 * tw, th}, {0, th, tw, th}};
  bool copies_equal = true;
  std::uint64_t checksum = rt_checksum(nullptr, 0);
  for (int b = 0; b < 2; ++b) {
    const Box& box = boxes[b];
    std::vector<float> in(size_t{box.w} * box.h), out(in.size(), -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i * 7 + b * 131) % 4099);
    CU_CHECK(copy_box(array, in.data(), box.x, box.y, box.w, box.h, true));
    CU_CHECK(copy_box(array, out.data(), box.x, box.y, box.w, box.h, false));
    copies_equal = copies_equal && in == out;
    checksum = rt_checksum(out.data(), out.size() * sizeof(float), checksum);
  }

  // The kernel samples the mapped texels through a texture object.
  constexpr int kSamples = 1024;
  std::vector<unsigned> xs(kSamples), ys(kSamples);
  std::vector<float> expected(kSamples);
  for (int i = 0; i < kSamples; ++i) {
    const Box& box = boxes[i % 2];
    const unsigned dx = (i * 37u) % box.w, dy = (i * 11u) % box.h;
    xs[i] = box.x + dx;
    ys[i] = box.y + dy;
    expected[i] = static_cast<float>(((size_t{dy} * box.w + dx) * 7 + (i % 2) * 131) % 4099);
  }
  CUDA_RESOURCE_DESC resource{};
  resource.resType = CU_RESOURCE_TYPE_ARRAY;
  resource.res.array.hArray = array;
  CUDA_TEXTURE_DESC texture{};
  texture.addressMode[0] = texture.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  texture.filterMode = CU_TR_FILTER_MODE_POINT;
  CUtexObject tex{};
  CU_CHECK(cuTexObjectCreate(&tex, &resource, &texture, nullptr));
  unsigned *dxs = nullptr, *dys = nullptr;
  float* dout = nullptr;
  RT_CHECK(cudaMalloc(&dxs, kSamples * sizeof(unsigned)));
  RT_CHECK(cudaMalloc(&dys, kSamples * sizeof(unsigned)));
  RT_CHECK(cudaMalloc(&dout, kSamples * sizeof(float)));
  RT_CHECK(cudaMemcpy(dxs, xs.data(), kSamples * sizeof(unsigned), cudaMemcpyHostToDevice));
  RT_CHECK(cudaMemcpy(dys, ys.data(), kSamples * sizeof(unsigned), cudaMemcpyHostToDevice));
  sample<<<kSamples / 256, 256>>>(tex, dxs, dys, dout, kSamples);
  RT_CHECK(cudaGetLastError());
  std::vector<float> sampled(kSamples);
  RT_CHECK(cudaMemcpy(sampled.data(), dout, kSamples * sizeof(float), cudaMemcpyDeviceToHost));
  const bool samples_equal = sampled == expected;
  checksum = rt_checksum(sampled.data(), sampled.size() * sizeof(float), checksum);

  // Unmapped again (the pool's memory stays the pool's), then everything goes.
  CUarrayMapInfo unmap[2] = {tiles(array, tw, 0, 2 * tw, th, 0, 0, device),
                             tiles(array, 0, th, tw, th, 0, 0, device)};
  const CUresult unmapped = cuMemMapArrayAsync(unmap, 2, stream);
  CU_CHECK(cuStreamSynchronize(stream));
  CU_CHECK(cuTexObjectDestroy(tex));
  CU_CHECK(cuArrayDestroy(array));
  CU_CHECK(cuMemRelease(pool));
  CU_CHECK(cuMemRelease(plain));
  RT_CHECK(cudaFree(dxs));
  RT_CHECK(cudaFree(dys));
  RT_CHECK(cudaFree(dout));
  const bool ok = copies_equal && samples_equal && unmapped == CUDA_SUCCESS &&
                  plain_pool != CUDA_SUCCESS && misaligned != CUDA_SUCCESS;
  return RT_REPORT(ok,
                   "tile=%ux%ux%u miptail_first_level=%u miptail_size=%llu granularity=%zu "
                   "copies_equal=%d samples_equal=%d plain_pool=%d misaligned=%d miptail=%d "
                   "unmapped=%d checksum=%016llx",
                   tw, th, props.tileExtent.depth, props.miptailFirstLevel,
                   static_cast<unsigned long long>(props.miptailSize), granularity, copies_equal,
                   samples_equal, static_cast<int>(plain_pool), static_cast<int>(misaligned),
                   static_cast<int>(miptail), static_cast<int>(unmapped),
                   static_cast<unsigned long long>(checksum));
}

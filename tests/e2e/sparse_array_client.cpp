// Sparse CUDA arrays for the CPU end-to-end tests (vmm_test.cpp): tiles mapped onto tile-pool
// allocations with cuMemMapArrayAsync, under LD_PRELOAD=libmpsshim.so against mpsshimd and the
// host-memory test driver (docs/copies.md). Each mode prints one result line ("PASS ..." or
// "FAIL ...") and exits 0 only when everything it checked held.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client_check.hpp"
#include "client_expect.hpp"

namespace {

constexpr unsigned kSide = 1024;  // the array: kSide x kSide floats, 128 x 128 tiles
constexpr unsigned kTile = 128;
constexpr std::size_t kTileBytes = std::size_t{64} << 10;

struct Setup {
  CUcontext ctx{};
  CUstream stream{};
};

Setup setup() {
  Setup s;
  CUdevice device{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING));
  return s;
}

CUarray sparse_array() {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = kSide;
  d.Height = kSide;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray array{};
  CHECK(cuArray3DCreate(&array, &d));
  return array;
}

CUmemAllocationProp pool_prop(bool tile_pool) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  if (tile_pool) prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
  return prop;
}

std::size_t granularity(const CUmemAllocationProp& prop) {
  std::size_t g = 0;
  CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return g;
}

// Tiles [x, x + width) x [y, y + height) (in texels) of level 0 onto `pool` at `offset`; an
// unmap when `pool` is 0.
CUarrayMapInfo tiles(CUarray array, unsigned x, unsigned y, unsigned width, unsigned height,
                     CUmemGenericAllocationHandle pool, std::size_t offset) {
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
  info.deviceBitMask = 1;  // device 0
  return info;
}

// A box of floats between the host and the array, on `stream`.
CUresult copy_box(CUarray array, float* host, unsigned x, unsigned y, unsigned width,
                  unsigned height, bool to_array, CUstream stream) {
  CUDA_MEMCPY2D c{};
  if (to_array) {
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host;
    c.srcPitch = width * sizeof(float);
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
    c.dstPitch = width * sizeof(float);
  }
  c.WidthInBytes = width * sizeof(float);
  c.Height = height;
  return cuMemcpy2DAsync(&c, stream);
}

// Properties, two tiles mapped, written and read back, unmapped; the refusals the driver gives.
int map() {
  const Setup s = setup();
  const CUarray array = sparse_array();
  CUDA_ARRAY_SPARSE_PROPERTIES props{};
  CHECK(cuArrayGetSparseProperties(&props, array));
  expect_true(props.tileExtent.width == kTile && props.tileExtent.height == kTile &&
                  props.tileExtent.depth == 1,
              "128 x 128 tiles of a float array, as on an H200");
  CUDA_ARRAY_MEMORY_REQUIREMENTS requirements{};
  expect(cuArrayGetMemoryRequirements(&requirements, array, 0), CUDA_ERROR_INVALID_VALUE,
         "memory requirements of a sparse array");

  const CUmemAllocationProp prop = pool_prop(true);
  const std::size_t g = granularity(prop);
  CUmemGenericAllocationHandle pool{}, plain{};
  CHECK(cuMemCreate(&pool, g, &prop, 0));
  const CUmemAllocationProp plain_prop = pool_prop(false);
  CHECK(cuMemCreate(&plain, g, &plain_prop, 0));

  // Two tiles side by side, at the pool's second 64 KiB.
  CUarrayMapInfo two = tiles(array, kTile, 0, 2 * kTile, kTile, pool, kTileBytes);
  CHECK(cuMemMapArrayAsync(&two, 1, s.stream));
  std::vector<float> in(2 * kTile * kTile), out(in.size(), -1.0f);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 9973) * 0.5f;
  CHECK(copy_box(array, in.data(), kTile, 0, 2 * kTile, kTile, true, s.stream));
  CHECK(copy_box(array, out.data(), kTile, 0, 2 * kTile, kTile, false, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  expect_true(std::memcmp(in.data(), out.data(), in.size() * sizeof(float)) == 0,
              "copies reach a sparse array's mapped tiles");

  CUarrayMapInfo bad = tiles(array, 0, 0, kTile, kTile, plain, 0);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE,
         "an allocation made without CU_MEM_CREATE_USAGE_TILE_POOL");
  bad = tiles(array, kTile / 2, 0, kTile, kTile, pool, 0);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE,
         "an offset that is not a tile's");
  bad = tiles(array, 0, 0, kTile, kTile, pool, g);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE, "past the pool's end");
  bad = tiles(array, 0, 0, kTile, kTile, pool, 0);
  bad.deviceBitMask = 2;
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE,
         "a device mask that is not the stream's device");
  bad = tiles(array, 0, 0, kTile, kTile, pool, 0);
  bad.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL;
  bad.subresource.miptail.offset = 0;
  bad.subresource.miptail.size = kTileBytes;
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE,
         "the mip tail of an array without levels (H200)");
  bad = tiles(array, 0, 0, kTile, kTile, 0, 0);
  bad.memHandle.memHandle = pool;  // an unmap names no allocation
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE,
         "an unmap that names an allocation");
  int not_an_array = 0;
  bad = tiles(reinterpret_cast<CUarray>(&not_an_array), 0, 0, kTile, kTile, pool, 0);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_HANDLE, "not an array");
  bad = tiles(array, 0, 0, kTile, kTile, 0xdead0000beefull, 0);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_HANDLE,
         "an allocation handle of no device");
  // Device 0's, but no id the server gave: refused there.
  bad = tiles(array, 0, 0, kTile, kTile, 0xdead0000beefull | (1ull << 24), 0);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_HANDLE,
         "an allocation the server never gave");
  CUDA_ARRAY3D_DESCRIPTOR dense{};
  dense.Width = dense.Height = kSide;
  dense.Format = CU_AD_FORMAT_FLOAT;
  dense.NumChannels = 1;
  CUarray plain_array{};
  CHECK(cuArray3DCreate(&plain_array, &dense));
  bad = tiles(plain_array, 0, 0, kTile, kTile, pool, 0);
  expect(cuMemMapArrayAsync(&bad, 1, s.stream), CUDA_ERROR_INVALID_VALUE, "a dense array");
  expect(cuMemMapArrayAsync(nullptr, 1, s.stream), CUDA_ERROR_INVALID_VALUE, "no list");

  // Several entries in one call, one of them an unmap of the tiles mapped above.
  CUarrayMapInfo list[2] = {tiles(array, kTile, 0, 2 * kTile, kTile, 0, 0),
                            tiles(array, 0, kTile, kTile, kTile, pool, 0)};
  CHECK(cuMemMapArrayAsync(list, 2, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  CHECK(cuMemRelease(plain));
  CHECK(cuMemRelease(pool));
  CHECK(cuArrayDestroy(plain_array));
  CHECK(cuArrayDestroy(array));
  return finish("map");
}

// Under a 4 MiB limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): the sparse array itself (4 MiB of
// texels) costs nothing; a tile pool its tiles mapped stays charged after cuMemRelease, as the
// driver keeps its memory, until the array goes.
int limit() {
  const Setup s = setup();
  const CUarray array = sparse_array();
  const CUmemAllocationProp prop = pool_prop(true);
  const std::size_t g = granularity(prop);
  expect_true(g == (std::size_t{2} << 20), "2 MiB tile-pool granularity");
  CUmemGenericAllocationHandle first{}, second{}, third{};
  CHECK(cuMemCreate(&first, g, &prop, 0));
  CUarrayMapInfo one = tiles(array, 0, 0, kTile, kTile, first, 0);
  CHECK(cuMemMapArrayAsync(&one, 1, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  CHECK(cuMemRelease(first));
  CHECK(cuMemCreate(&second, g, &prop, 0));
  expect(cuMemCreate(&third, g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY,
         "a released tile pool that a tile maps still counts");
  // Unmapping the tile alone does not end the hold (the server does not follow tiles).
  one = tiles(array, 0, 0, kTile, kTile, 0, 0);
  CHECK(cuMemMapArrayAsync(&one, 1, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  CHECK(cuArrayDestroy(array));
  CHECK(cuMemCreate(&third, g, &prop, 0));  // credited back with the array
  CHECK(cuMemRelease(second));
  CHECK(cuMemRelease(third));
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  expect_true(free_bytes == total, "nothing held at the end");
  return finish("limit");
}

// Exits with a tile mapped onto a released pool and the array alive: the server frees both.
int exit_mapped() {
  const Setup s = setup();
  const CUarray array = sparse_array();
  const CUmemAllocationProp prop = pool_prop(true);
  CUmemGenericAllocationHandle pool{};
  CHECK(cuMemCreate(&pool, granularity(prop), &prop, 0));
  CUarrayMapInfo one = tiles(array, 0, 0, kTile, kTile, pool, 0);
  CHECK(cuMemMapArrayAsync(&one, 1, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  CHECK(cuMemRelease(pool));
  return finish("exit-mapped");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "map";
  if (mode == "map") return map();
  if (mode == "limit") return limit();
  if (mode == "exit-mapped") return exit_mapped();
  std::printf("FAIL unknown mode %s\n", mode.c_str());
  return 2;
}

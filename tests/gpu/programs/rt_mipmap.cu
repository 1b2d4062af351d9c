// A mipmapped texture: cudaMallocMipmappedArray of 256x256 floats with 5 levels, each level
// filled through cudaGetMipmappedArrayLevel and cudaMemcpy2DToArray, a texture object over the
// mipmapped array sampled with tex2DLod at every level and between levels (linear mipmap
// filtering), and a level written by a kernel through a surface object and read back. The result
// fields must equal natively and under mpsshim (docs/copies.md).
static const char* const kProgram = "rt_mipmap";
#include <vector>

#include "rt_common.cuh"

namespace {

constexpr int kSide = 256;
constexpr int kLevels = 5;

__global__ void sample(cudaTextureObject_t tex, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float u = (i % 17) / 17.0f + 0.01f;
  const float v = (i % 13) / 13.0f + 0.02f;
  const float lod = (i % 41) * 0.1f;  // 0 .. 4, between levels too
  out[i] = tex2DLod<float>(tex, u, v, lod);
}

__global__ void write_surface(cudaSurfaceObject_t surf, int side) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < side && y < side) surf2Dwrite(static_cast<float>(x * 3 + y), surf, x * 4, y);
}

}  // namespace

int main() {
  cudaChannelFormatDesc format = cudaCreateChannelDesc<float>();
  cudaMipmappedArray_t mipmap{};
  RT_CHECK(cudaMallocMipmappedArray(&mipmap, &format, make_cudaExtent(kSide, kSide, 0), kLevels,
                                    cudaArraySurfaceLoadStore));
  for (int l = 0; l < kLevels; ++l) {
    cudaArray_t level{};
    RT_CHECK(cudaGetMipmappedArrayLevel(&level, mipmap, l));
    const int side = kSide >> l;
    std::vector<float> texels(static_cast<size_t>(side) * side);
    for (int i = 0; i < side * side; ++i) texels[i] = static_cast<float>(l * 1000 + i % 251);
    RT_CHECK(cudaMemcpy2DToArray(level, 0, 0, texels.data(), side * sizeof(float),
                                 side * sizeof(float), side, cudaMemcpyHostToDevice));
  }
  cudaResourceDesc resource{};
  resource.resType = cudaResourceTypeMipmappedArray;
  resource.res.mipmap.mipmap = mipmap;
  cudaTextureDesc texture{};
  texture.addressMode[0] = texture.addressMode[1] = cudaAddressModeClamp;
  texture.filterMode = cudaFilterModePoint;
  texture.mipmapFilterMode = cudaFilterModeLinear;
  texture.normalizedCoords = 1;
  texture.maxMipmapLevelClamp = kLevels - 1;
  cudaTextureObject_t tex{};
  RT_CHECK(cudaCreateTextureObject(&tex, &resource, &texture, nullptr));
  const int n = 4096;
  float* out = nullptr;
  RT_CHECK(cudaMalloc(&out, n * sizeof(float)));
  sample<<<n / 256, 256>>>(tex, out, n);
  RT_CHECK_LAUNCH();
  std::vector<float> sampled(n);
  RT_CHECK(cudaMemcpy(sampled.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  RT_CHECK(cudaDestroyTextureObject(tex));

  // Level 1 through a surface.
  cudaArray_t level1{};
  RT_CHECK(cudaGetMipmappedArrayLevel(&level1, mipmap, 1));
  cudaResourceDesc surface_resource{};
  surface_resource.resType = cudaResourceTypeArray;
  surface_resource.res.array.array = level1;
  cudaSurfaceObject_t surf{};
  RT_CHECK(cudaCreateSurfaceObject(&surf, &surface_resource));
  const int side1 = kSide / 2;
  write_surface<<<dim3(side1 / 16, side1 / 16), dim3(16, 16)>>>(surf, side1);
  RT_CHECK_LAUNCH();
  std::vector<float> written(static_cast<size_t>(side1) * side1);
  RT_CHECK(cudaMemcpy2DFromArray(written.data(), side1 * sizeof(float), level1, 0, 0,
                                 side1 * sizeof(float), side1, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int y = 0; y < side1; ++y)
    for (int x = 0; x < side1; ++x)
      wrong += written[y * side1 + x] != static_cast<float>(x * 3 + y);
  RT_CHECK(cudaDestroySurfaceObject(surf));
  cudaExtent extent{};
  cudaChannelFormatDesc level_format{};
  unsigned flags = 0;
  RT_CHECK(cudaArrayGetInfo(&level_format, &extent, &flags, level1));
  RT_CHECK(cudaFree(out));
  RT_CHECK(cudaFreeMipmappedArray(mipmap));
  return RT_REPORT(wrong == 0, "level1=%zux%zu wrong=%d checksum=%016llx", extent.width,
                   extent.height, wrong,
                   static_cast<unsigned long long>(rt_checksum(sampled.data(), n * sizeof(float))));
}

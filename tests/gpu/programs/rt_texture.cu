// Texture objects with point filtering: one over a pitch-linear 2D buffer (cudaMallocPitch),
// one over a cudaArray. A kernel samples every texel at its centre (must return it exactly) and
// a few coordinates outside the image (clamp addressing: the nearest edge texel).
static const char* const kProgram = "rt_texture";
#include <vector>

#include "rt_common.cuh"

__global__ void sample(cudaTextureObject_t tex, float* out, int w, int h) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f);
}

__global__ void sample_outside(cudaTextureObject_t tex, float* out, int w, int h) {
  out[0] = tex2D<float>(tex, -3.0f, -3.0f);          // -> (0, 0)
  out[1] = tex2D<float>(tex, w + 10.0f, 0.5f);       // -> (w-1, 0)
  out[2] = tex2D<float>(tex, 0.5f, h + 10.0f);       // -> (0, h-1)
  out[3] = tex2D<float>(tex, w + 10.0f, h + 10.0f);  // -> (w-1, h-1)
}

cudaTextureObject_t make_texture(const cudaResourceDesc& resource) {
  cudaTextureDesc desc{};
  desc.addressMode[0] = cudaAddressModeClamp;
  desc.addressMode[1] = cudaAddressModeClamp;
  desc.filterMode = cudaFilterModePoint;
  desc.readMode = cudaReadModeElementType;
  desc.normalizedCoords = 0;
  cudaTextureObject_t tex = 0;
  RT_CHECK(cudaCreateTextureObject(&tex, &resource, &desc, nullptr));
  return tex;
}

// Samples through `tex`; returns the number of wrong texels.
int check(cudaTextureObject_t tex, const std::vector<float>& image, int w, int h, float* d_out,
          std::uint64_t& checksum) {
  sample<<<dim3((w + 15) / 16, (h + 15) / 16), dim3(16, 16)>>>(tex, d_out, w, h);
  RT_CHECK_LAUNCH();
  std::vector<float> got(static_cast<size_t>(w) * h + 4);
  RT_CHECK(cudaMemcpy(got.data(), d_out, sizeof(float) * w * h, cudaMemcpyDeviceToHost));
  sample_outside<<<1, 1>>>(tex, d_out, w, h);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpy(got.data() + w * h, d_out, sizeof(float) * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < w * h; ++i) wrong += got[i] != image[i];
  const float corners[4] = {image[0], image[w - 1], image[(h - 1) * w], image[(h - 1) * w + w - 1]};
  for (int c = 0; c < 4; ++c) wrong += got[w * h + c] != corners[c];
  checksum = rt_checksum(got.data(), sizeof(float) * got.size(), checksum);
  return wrong;
}

int main() {
  const int w = 300, h = 123;
  std::vector<float> image(static_cast<size_t>(w) * h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) image[y * w + x] = static_cast<float>(y * 1000 + x) * 0.5f;
  float* d_out;
  RT_CHECK(cudaMalloc(&d_out, sizeof(float) * w * h));
  std::uint64_t checksum = 1469598103934665603ull;

  // Pitch-linear 2D.
  float* pitched;
  size_t pitch = 0;
  RT_CHECK(cudaMallocPitch(reinterpret_cast<void**>(&pitched), &pitch, sizeof(float) * w, h));
  RT_CHECK(cudaMemcpy2D(pitched, pitch, image.data(), sizeof(float) * w, sizeof(float) * w, h,
                        cudaMemcpyHostToDevice));
  cudaResourceDesc linear{};
  linear.resType = cudaResourceTypePitch2D;
  linear.res.pitch2D.devPtr = pitched;
  linear.res.pitch2D.desc = cudaCreateChannelDesc<float>();
  linear.res.pitch2D.width = w;
  linear.res.pitch2D.height = h;
  linear.res.pitch2D.pitchInBytes = pitch;
  cudaTextureObject_t tex_pitch = make_texture(linear);
  const int wrong_pitch2d = check(tex_pitch, image, w, h, d_out, checksum);

  // cudaArray.
  cudaChannelFormatDesc channel = cudaCreateChannelDesc<float>();
  cudaArray_t array;
  RT_CHECK(cudaMallocArray(&array, &channel, w, h));
  RT_CHECK(cudaMemcpy2DToArray(array, 0, 0, image.data(), sizeof(float) * w, sizeof(float) * w, h,
                               cudaMemcpyHostToDevice));
  cudaResourceDesc on_array{};
  on_array.resType = cudaResourceTypeArray;
  on_array.res.array.array = array;
  cudaTextureObject_t tex_array = make_texture(on_array);
  const int wrong_array = check(tex_array, image, w, h, d_out, checksum);

  RT_CHECK(cudaDestroyTextureObject(tex_pitch));
  RT_CHECK(cudaDestroyTextureObject(tex_array));
  RT_CHECK(cudaFreeArray(array));
  RT_CHECK(cudaFree(pitched));
  RT_CHECK(cudaFree(d_out));
  const bool ok = wrong_pitch2d == 0 && wrong_array == 0;
  return RT_REPORT(ok, "width=%d height=%d wrong_pitch2d=%d wrong_array=%d checksum=%016llx", w, h,
                   wrong_pitch2d, wrong_array, static_cast<unsigned long long>(checksum));
}

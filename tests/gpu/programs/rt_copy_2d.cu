// 2D and 3D copies: cudaMallocPitch with cudaMemcpy2D both ways from pageable and pinned host
// memory, cudaMemcpy2DAsync, cudaMalloc3D with cudaMemcpy3D both ways, and a cudaArray filled by
// cudaMemcpy2DToArray and read back by cudaMemcpy2DFromArray. A kernel changes the pitched data
// in place, so a copy that ignored the pitch would show.
static const char* const kProgram = "rt_copy_2d";
#include <cstring>
#include <vector>

#include "rt_common.cuh"

__global__ void bump_rows(char* base, size_t pitch, int width_elems, int height) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y;
  if (x < width_elems && y < height) reinterpret_cast<int*>(base + y * pitch)[x] += 1000 * y;
}

int main() {
  const int W = 1000, H = 77;  // elements per row (not a pitch multiple), rows
  const size_t row = sizeof(int) * W, host_pitch = row + 40;
  std::vector<char> pageable(host_pitch * H), back(host_pitch * H);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      reinterpret_cast<int*>(pageable.data() + y * host_pitch)[x] = y * 100003 + x;
  auto value = [&](const char* base, size_t pitch, int x, int y) {
    return reinterpret_cast<const int*>(base + y * pitch)[x];
  };
  int wrong_2d = 0, wrong_2d_async = 0, wrong_3d = 0, wrong_array = 0;

  // cudaMallocPitch + cudaMemcpy2D, pageable both ways, a kernel in between.
  char* dev;
  size_t pitch = 0;
  RT_CHECK(cudaMallocPitch(reinterpret_cast<void**>(&dev), &pitch, row, H));
  RT_CHECK(cudaMemcpy2D(dev, pitch, pageable.data(), host_pitch, row, H, cudaMemcpyHostToDevice));
  bump_rows<<<dim3((W + 255) / 256, H), 256>>>(dev, pitch, W, H);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpy2D(back.data(), host_pitch, dev, pitch, row, H, cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      wrong_2d += value(back.data(), host_pitch, x, y) != y * 100003 + x + 1000 * y;
  std::uint64_t checksum = rt_checksum(back.data(), back.size());

  // Pinned, synchronous and async, on a stream.
  char *pinned_in, *pinned_out;
  RT_CHECK(cudaMallocHost(&pinned_in, host_pitch * H));
  RT_CHECK(cudaMallocHost(&pinned_out, host_pitch * H));
  std::memcpy(pinned_in, pageable.data(), host_pitch * H);
  RT_CHECK(cudaMemcpy2D(dev, pitch, pinned_in, host_pitch, row, H, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bump_rows<<<dim3((W + 255) / 256, H), 256, 0, stream>>>(dev, pitch, W, H);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpy2DAsync(pinned_out, host_pitch, dev, pitch, row, H, cudaMemcpyDeviceToHost,
                             stream));
  RT_CHECK(cudaStreamSynchronize(stream));
  RT_CHECK(
      cudaMemcpy2DAsync(dev, pitch, pinned_in, host_pitch, row, H, cudaMemcpyHostToDevice, stream));
  // `stream` is non-blocking: the legacy-stream copy below does not wait for it by itself.
  RT_CHECK(cudaStreamSynchronize(stream));
  RT_CHECK(cudaMemcpy2D(back.data(), host_pitch, dev, pitch, row, H, cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      wrong_2d_async += value(pinned_out, host_pitch, x, y) != y * 100003 + x + 1000 * y;
      wrong_2d_async += value(back.data(), host_pitch, x, y) != y * 100003 + x;
    }
  }
  checksum = rt_checksum(pinned_out, host_pitch * H, checksum);

  // cudaMalloc3D + cudaMemcpy3D both ways (depth 3), host side tightly packed.
  const int D = 3;
  cudaExtent extent = make_cudaExtent(row, H, D);
  cudaPitchedPtr dev3;
  RT_CHECK(cudaMalloc3D(&dev3, extent));
  std::vector<int> volume(static_cast<size_t>(W) * H * D), volume_back(volume.size(), -1);
  for (size_t i = 0; i < volume.size(); ++i) volume[i] = static_cast<int>(i * 37 % 1000003);
  cudaMemcpy3DParms up{};
  up.srcPtr = make_cudaPitchedPtr(volume.data(), row, W, H);
  up.dstPtr = dev3;
  up.extent = extent;
  up.kind = cudaMemcpyHostToDevice;
  RT_CHECK(cudaMemcpy3D(&up));
  cudaMemcpy3DParms down{};
  down.srcPtr = dev3;
  down.dstPtr = make_cudaPitchedPtr(volume_back.data(), row, W, H);
  down.extent = extent;
  down.kind = cudaMemcpyDeviceToHost;
  RT_CHECK(cudaMemcpy3D(&down));
  for (size_t i = 0; i < volume.size(); ++i) wrong_3d += volume_back[i] != volume[i];
  checksum = rt_checksum(volume_back.data(), sizeof(int) * volume_back.size(), checksum);

  // cudaMallocArray + cudaMemcpy2DToArray / FromArray.
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<int>();
  cudaArray_t array;
  RT_CHECK(cudaMallocArray(&array, &desc, W, H));
  RT_CHECK(cudaMemcpy2DToArray(array, 0, 0, pageable.data(), host_pitch, row, H,
                               cudaMemcpyHostToDevice));
  std::vector<char> from_array(host_pitch * H, 0);
  RT_CHECK(cudaMemcpy2DFromArray(from_array.data(), host_pitch, array, 0, 0, row, H,
                                 cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      wrong_array += value(from_array.data(), host_pitch, x, y) != y * 100003 + x;

  RT_CHECK(cudaFreeArray(array));
  RT_CHECK(cudaFree(dev3.ptr));
  RT_CHECK(cudaFree(dev));
  RT_CHECK(cudaFreeHost(pinned_in));
  RT_CHECK(cudaFreeHost(pinned_out));
  RT_CHECK(cudaStreamDestroy(stream));
  const bool ok = wrong_2d == 0 && wrong_2d_async == 0 && wrong_3d == 0 && wrong_array == 0;
  return RT_REPORT(ok,
                   "width=%d height=%d wrong_2d=%d wrong_2d_async=%d wrong_3d=%d wrong_array=%d "
                   "checksum=%016llx",
                   W, H, wrong_2d, wrong_2d_async, wrong_3d, wrong_array,
                   static_cast<unsigned long long>(checksum));
}

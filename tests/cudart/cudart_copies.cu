// 2D/3D copies, CUDA arrays, peer copies and texture objects through the CUDA runtime: every
// memory kind on each side (pageable, pinned, pitched device memory, arrays), synchronous and
// asynchronous, small boxes and boxes that take many staging chunks or rows wider than one.
// Every byte is checked, the padding around each box included. Prints "cudart_copies: ... PASS"
// and exits 0 only when all of it is right. Optional argument: the height of the big box.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

constexpr const char* kProgram = "cudart_copies";
#include "cudart_check.cuh"

// Same name, signature and semantics as the test driver's tex2d_fetch_f32
// (tests/testdriver/kernels.cpp): point-sampled, clamped, unnormalized coordinates.
extern "C" __global__ void tex2d_fetch_f32(cudaTextureObject_t tex, float* out, int width,
                                           int height) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) out[y * width + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f);
}

namespace {

constexpr unsigned char kGuard = 0xee;

unsigned char pattern(std::size_t i, unsigned salt) {
  return static_cast<unsigned char>((i * 131u + salt * 17u + (i >> 9)) & 0xff);
}

void fill(unsigned char* p, std::size_t n, unsigned salt) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern(i, salt);
}

// Row r of the box in `dst` (pitch dst_pitch, from byte dst_x) equals row r of `src`; every
// other byte of dst is kGuard. Returns the first wrong offset, or -1.
long check_box(const unsigned char* dst, std::size_t dst_pitch, std::size_t dst_x,
               std::size_t dst_bytes, const unsigned char* src, std::size_t src_pitch,
               std::size_t src_x, std::size_t width, std::size_t height) {
  for (std::size_t i = 0; i < dst_bytes; ++i) {
    std::size_t row = i / dst_pitch, col = i % dst_pitch;
    bool inside = row < height && col >= dst_x && col < dst_x + width;
    unsigned char want = inside ? src[row * src_pitch + src_x + (col - dst_x)] : kGuard;
    if (dst[i] != want) return static_cast<long>(i);
  }
  return -1;
}

// Host -> pitched device -> host for a width x height box, through `up` and `down` host
// buffers that may be pageable or pinned. The device allocation is cleared first so that a
// row that went astray shows.
int round_trip(const char* what, unsigned char* up, unsigned char* down, std::size_t width,
               std::size_t height, cudaStream_t stream, bool async) {
  const std::size_t host_pitch = width + 24;  // not the device's pitch
  const std::size_t src_x = 8, dst_x = 16;
  void* dev = nullptr;
  std::size_t dev_pitch = 0;
  CHECK(cudaMallocPitch(&dev, &dev_pitch, width + src_x, height));
  CHECK(cudaMemset2D(dev, dev_pitch, 0, dev_pitch, height));
  fill(up, host_pitch * height, static_cast<unsigned>(width + height));
  std::memset(down, kGuard, host_pitch * height);
  char* dev_bytes = static_cast<char*>(dev);
  if (async) {
    CHECK(cudaMemcpy2DAsync(dev_bytes + src_x, dev_pitch, up + src_x, host_pitch, width, height,
                            cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpy2DAsync(down + dst_x, host_pitch, dev_bytes + src_x, dev_pitch, width, height,
                            cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
  } else {
    CHECK(cudaMemcpy2D(dev_bytes + src_x, dev_pitch, up + src_x, host_pitch, width, height,
                       cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2D(down + dst_x, host_pitch, dev_bytes + src_x, dev_pitch, width, height,
                       cudaMemcpyDeviceToHost));
  }
  long bad =
      check_box(down, host_pitch, dst_x, host_pitch * height, up, host_pitch, src_x, width, height);
  EXPECT(bad < 0, "%s %zux%zu: byte %ld (row %ld) is wrong", what, width, height, bad,
         bad / static_cast<long>(host_pitch));
  CHECK(cudaFree(dev));
  return 0;
}

int copies_2d(std::size_t big_height) {
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));  // blocking: ordered after the memsets on the NULL stream
  const std::size_t kMaxWidth = (5u << 20) + 24 + 64;  // rows wider than a 2 MiB staging chunk
  const std::size_t small_w = 148, small_h = 19;
  const std::size_t big_w = 4000;
  const std::size_t host_bytes = std::max((big_w + 24) * big_height, kMaxWidth * 2 + 64);
  std::vector<unsigned char> pageable_up(host_bytes), pageable_down(host_bytes);
  unsigned char *pinned_up = nullptr, *pinned_down = nullptr;
  CHECK(cudaMallocHost(&pinned_up, host_bytes));
  CHECK(cudaMallocHost(&pinned_down, host_bytes));

  struct Case {
    std::size_t w, h;
  } cases[] = {{small_w, small_h}, {big_w, big_height}, {(5u << 20) + 40, 2}, {1, 1}};
  for (const Case& c : cases) {
    for (int async = 0; async < 2; ++async) {
      if (round_trip(async ? "pageable async" : "pageable", pageable_up.data(),
                     pageable_down.data(), c.w, c.h, stream, async))
        return 1;
      if (round_trip(async ? "pinned async" : "pinned", pinned_up, pinned_down, c.w, c.h, stream,
                     async))
        return 1;
      // Mixed: pinned up, pageable down.
      if (round_trip("pinned up, pageable down", pinned_up, pageable_down.data(), c.w, c.h, stream,
                     async))
        return 1;
    }
  }

  // Device to device between two pitched allocations, with offsets on both sides.
  void *a = nullptr, *b = nullptr;
  std::size_t pa = 0, pb = 0;
  CHECK(cudaMallocPitch(&a, &pa, 300, 40));
  CHECK(cudaMallocPitch(&b, &pb, 600, 40));
  std::vector<unsigned char> host(pa * 40), back(pb * 40);
  fill(host.data(), host.size(), 5);
  CHECK(cudaMemcpy(a, host.data(), host.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(b, kGuard, pb * 40));
  CHECK(cudaMemcpy2D(static_cast<char*>(b) + 100, pb, static_cast<char*>(a) + 3, pa, 250, 40,
                     cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy(back.data(), b, back.size(), cudaMemcpyDeviceToHost));
  long bad = check_box(back.data(), pb, 100, back.size(), host.data(), pa, 3, 250, 40);
  EXPECT(bad < 0, "device to device: byte %ld is wrong", bad);

  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFreeHost(pinned_up));
  CHECK(cudaFreeHost(pinned_down));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}

int copies_3d() {
  const cudaExtent extent = make_cudaExtent(72, 9, 5);  // bytes, rows, slices
  cudaPitchedPtr dev;
  CHECK(cudaMalloc3D(&dev, extent));
  CHECK(cudaMemset3D(dev, 0, extent));
  const std::size_t host_pitch = 80, host_rows = 11;  // a host volume larger than the box
  std::vector<unsigned char> up(host_pitch * host_rows * 6), down(up.size(), kGuard);
  fill(up.data(), up.size(), 9);

  cudaMemcpy3DParms in = {};
  in.srcPtr = make_cudaPitchedPtr(up.data(), host_pitch, host_pitch, host_rows);
  in.srcPos = make_cudaPos(4, 1, 1);
  in.dstPtr = dev;
  in.extent = extent;
  in.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&in));
  cudaMemcpy3DParms out = {};
  out.srcPtr = dev;
  out.dstPtr = make_cudaPitchedPtr(down.data(), host_pitch, host_pitch, host_rows);
  out.dstPos = make_cudaPos(0, 2, 0);
  out.extent = extent;
  out.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&out));
  for (std::size_t z = 0; z < 6; ++z) {
    for (std::size_t y = 0; y < host_rows; ++y) {
      for (std::size_t x = 0; x < host_pitch; ++x) {
        bool inside = z < extent.depth && y >= 2 && y < 2 + extent.height && x < extent.width;
        unsigned char want =
            inside ? up[((z + 1) * host_rows + (y - 2 + 1)) * host_pitch + x + 4] : kGuard;
        unsigned char got = down[(z * host_rows + y) * host_pitch + x];
        EXPECT(got == want, "3D copy: x %zu y %zu z %zu is %d, not %d", x, y, z, got, want);
      }
    }
  }

  // The same volume asynchronously, from pinned memory, into a second device volume.
  cudaPitchedPtr dev2;
  CHECK(cudaMalloc3D(&dev2, extent));
  unsigned char* pinned = nullptr;
  CHECK(cudaMallocHost(&pinned, up.size()));
  std::memset(pinned, kGuard, up.size());
  cudaMemcpy3DParms d2d = {};
  d2d.srcPtr = dev;
  d2d.dstPtr = dev2;
  d2d.extent = extent;
  d2d.kind = cudaMemcpyDeviceToDevice;
  CHECK(cudaMemcpy3DAsync(&d2d, 0));
  out.srcPtr = dev2;
  out.dstPtr = make_cudaPitchedPtr(pinned, host_pitch, host_pitch, host_rows);
  CHECK(cudaMemcpy3DAsync(&out, 0));
  CHECK(cudaDeviceSynchronize());
  EXPECT(std::memcmp(pinned, down.data(), down.size()) == 0, "the async 3D copy differs");
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(dev.ptr));
  CHECK(cudaFree(dev2.ptr));
  return 0;
}

int arrays_and_textures() {
  const int width = 37, height = 23;
  std::vector<float> values(width * height), back(width * height, -1.0f);
  for (int i = 0; i < width * height; ++i) values[i] = 0.25f * static_cast<float>(i) - 3.0f;

  // An array: in from the host, out to the host and to device memory.
  cudaChannelFormatDesc channel = cudaCreateChannelDesc<float>();
  cudaArray_t array = nullptr;
  CHECK(cudaMallocArray(&array, &channel, width, height));
  CHECK(cudaMemcpy2DToArray(array, 0, 0, values.data(), width * sizeof(float),
                            width * sizeof(float), height, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy2DFromArray(back.data(), width * sizeof(float), array, 0, 0,
                              width * sizeof(float), height, cudaMemcpyDeviceToHost));
  EXPECT(back == values, "the array round trip differs");
  cudaChannelFormatDesc got_channel;
  cudaExtent got_extent;
  unsigned got_flags = 0;
  CHECK(cudaArrayGetInfo(&got_channel, &got_extent, &got_flags, array));
  EXPECT(got_extent.width == static_cast<std::size_t>(width) &&
             got_extent.height == static_cast<std::size_t>(height) && got_channel.x == 32 &&
             got_channel.f == cudaChannelFormatKindFloat,
         "cudaArrayGetInfo says %zux%zu, %d bits", got_extent.width, got_extent.height,
         got_channel.x);

  // Peer copy on device 0: device to device.
  float *dev = nullptr, *dev2 = nullptr, *out = nullptr;
  std::size_t pitch = 0;
  CHECK(cudaMallocPitch(&dev, &pitch, width * sizeof(float), height));
  CHECK(cudaMalloc(&dev2, width * height * sizeof(float)));
  CHECK(cudaMalloc(&out, width * height * sizeof(float)));
  CHECK(cudaMemcpy2DFromArray(dev, pitch, array, 0, 0, width * sizeof(float), height,
                              cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy2D(dev2, width * sizeof(float), dev, pitch, width * sizeof(float), height,
                     cudaMemcpyDeviceToDevice));
  float* peer = nullptr;
  CHECK(cudaMalloc(&peer, width * height * sizeof(float)));
  CHECK(cudaMemcpyPeer(peer, 0, dev2, 0, width * height * sizeof(float)));
  std::fill(back.begin(), back.end(), -1.0f);
  CHECK(cudaMemcpy(back.data(), peer, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(back == values, "the peer copy differs");

  // A texture object over the pitched buffer, fetched by a kernel.
  cudaResourceDesc resource = {};
  resource.resType = cudaResourceTypePitch2D;
  resource.res.pitch2D.devPtr = dev;
  resource.res.pitch2D.desc = channel;
  resource.res.pitch2D.width = width;
  resource.res.pitch2D.height = height;
  resource.res.pitch2D.pitchInBytes = pitch;
  cudaTextureDesc texture = {};
  texture.addressMode[0] = cudaAddressModeClamp;
  texture.addressMode[1] = cudaAddressModeClamp;
  texture.filterMode = cudaFilterModePoint;
  texture.readMode = cudaReadModeElementType;
  cudaTextureObject_t tex = 0;
  CHECK(cudaCreateTextureObject(&tex, &resource, &texture, nullptr));
  cudaResourceDesc got_resource = {};
  CHECK(cudaGetTextureObjectResourceDesc(&got_resource, tex));
  EXPECT(got_resource.resType == cudaResourceTypePitch2D &&
             got_resource.res.pitch2D.devPtr == dev &&
             got_resource.res.pitch2D.pitchInBytes == pitch,
         "the texture's resource reads back differently");
  dim3 block(16, 16), grid((width + 15) / 16, (height + 15) / 16);
  tex2d_fetch_f32<<<grid, block>>>(tex, out, width, height);
  CHECK(cudaGetLastError());
  std::fill(back.begin(), back.end(), -1.0f);
  CHECK(cudaMemcpy(back.data(), out, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(back == values, "the pitch2D texture fetch differs");
  CHECK(cudaDestroyTextureObject(tex));

  // And over the array.
  resource = {};
  resource.resType = cudaResourceTypeArray;
  resource.res.array.array = array;
  CHECK(cudaCreateTextureObject(&tex, &resource, &texture, nullptr));
  CHECK(cudaMemset(out, 0, width * height * sizeof(float)));
  tex2d_fetch_f32<<<grid, block>>>(tex, out, width, height);
  CHECK(cudaGetLastError());
  std::fill(back.begin(), back.end(), -1.0f);
  CHECK(cudaMemcpy(back.data(), out, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(back == values, "the array texture fetch differs");
  CHECK(cudaDestroyTextureObject(tex));

  CHECK(cudaFreeArray(array));
  CHECK(cudaFree(dev));
  CHECK(cudaFree(dev2));
  CHECK(cudaFree(peer));
  CHECK(cudaFree(out));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t big_height = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1500;
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  EXPECT(devices >= 1, "no device");
  if (copies_2d(big_height) != 0) return 1;
  if (copies_3d() != 0) return 1;
  if (arrays_and_textures() != 0) return 1;
  CHECK(cudaDeviceSynchronize());
  std::printf(
      "cudart_copies: 2D/3D copies (pageable, pinned, device, arrays), peer copy and "
      "texture fetches correct PASS\n");
  return 0;
}

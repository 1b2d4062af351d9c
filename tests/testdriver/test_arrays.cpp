// CUDA arrays, 2D/3D copies and texture objects.
#include <cstdint>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr std::size_t kWidth = 24;  // floats per row
constexpr std::size_t kHeight = 5;
constexpr std::size_t kPitch = 512;  // bytes

CUDA_MEMCPY3D linear_copy(CUdeviceptr src, std::size_t src_pitch, CUdeviceptr dst,
                          std::size_t dst_pitch, std::size_t width, std::size_t height) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = src;
  c.srcPitch = src_pitch;
  c.srcHeight = height;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dst;
  c.dstPitch = dst_pitch;
  c.dstHeight = height;
  c.WidthInBytes = width;
  c.Height = height;
  c.Depth = 1;
  return c;
}

TEST_CASE("a pitched 2D copy moves the box and nothing else", "[arrays]") {
  Session s;
  std::vector<float> packed(kWidth * kHeight);
  std::iota(packed.begin(), packed.end(), 1.0f);
  const CUdeviceptr tight = s.alloc(packed.size() * sizeof(float));
  const CUdeviceptr pitched = s.alloc(kPitch * kHeight);
  s.upload(tight, packed);
  REQUIRE_CU(s.sut.cuMemsetD8Async(pitched, 0, kPitch * kHeight, s.stream));

  CUDA_MEMCPY3D c =
      linear_copy(tight, kWidth * sizeof(float), pitched, kPitch, kWidth * sizeof(float), kHeight);
  REQUIRE_CU(s.sut.cuMemcpy3DAsync_v2(&c, s.stream));
  const auto back = s.download<float>(pitched, kPitch * kHeight / sizeof(float));

  for (std::size_t y = 0; y < kHeight; ++y) {
    for (std::size_t x = 0; x < kPitch / sizeof(float); ++x) {
      const float expected = x < kWidth ? packed[y * kWidth + x] : 0.0f;
      INFO("x " << x << " y " << y);
      CHECK(back[y * kPitch / sizeof(float) + x] == expected);
    }
  }
}

TEST_CASE("a 2D copy past the end of an allocation is refused", "[arrays]") {
  Session s;
  const CUdeviceptr a = s.alloc(kPitch * kHeight);
  const CUdeviceptr b = s.alloc(kPitch * kHeight);
  CUDA_MEMCPY3D c = linear_copy(a, kPitch, b, kPitch, 64, kHeight + 1);
  CHECK_CU(s.sut.cuMemcpy3DAsync_v2(&c, s.stream), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("arrays hold what is copied in, and texture objects fetch it", "[arrays]") {
  Session s;
  const int live_before = driver().live_objects();
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = kWidth;
  desc.Height = kHeight;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  CUarray array = nullptr;
  REQUIRE_CU(s.sut.cuArray3DCreate_v2(&array, &desc));
  std::vector<float> values(kWidth * kHeight);
  std::iota(values.begin(), values.end(), 0.5f);
  const CUdeviceptr src = s.alloc(values.size() * sizeof(float));
  s.upload(src, values);

  CUDA_MEMCPY3D in =
      linear_copy(src, kWidth * sizeof(float), 0, 0, kWidth * sizeof(float), kHeight);
  in.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  in.dstArray = array;
  REQUIRE_CU(s.sut.cuMemcpy3DAsync_v2(&in, s.stream));
  CUDA_MEMCPY3D too_wide = in;
  too_wide.WidthInBytes += sizeof(float);
  CHECK_CU(s.sut.cuMemcpy3DAsync_v2(&too_wide, s.stream), CUDA_ERROR_INVALID_VALUE);

  CUDA_RESOURCE_DESC resource{};
  resource.resType = CU_RESOURCE_TYPE_ARRAY;
  resource.res.array.hArray = array;
  CUDA_TEXTURE_DESC texture{};
  CUtexObject tex = 0;
  REQUIRE_CU(s.sut.cuTexObjectCreate(&tex, &resource, &texture, nullptr));
  CHECK(tex != 0);
  const CUdeviceptr out = s.alloc(values.size() * sizeof(float));
  CUfunction fetch = s.function("tex2d_fetch_f32");
  int width = kWidth, height = kHeight;
  void* args[] = {&tex, const_cast<CUdeviceptr*>(&out), &width, &height};
  REQUIRE_CU(s.sut.cuLaunchKernel(fetch, 1, 1, 1, 32, 1, 1, 0, s.stream, args, nullptr));

  CHECK(s.download<float>(out, values.size()) == values);
  REQUIRE_CU(s.sut.cuTexObjectDestroy(tex));
  CHECK_CU(s.sut.cuTexObjectDestroy(tex), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuArrayDestroy(array));
  CHECK_CU(s.sut.cuArrayDestroy(array), CUDA_ERROR_INVALID_HANDLE);
  REQUIRE_CU(s.sut.cuMemFree_v2(src));
  REQUIRE_CU(s.sut.cuMemFree_v2(out));
  CHECK(driver().live_objects() == live_before);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

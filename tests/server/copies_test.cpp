// 2D/3D copies, CUDA arrays and texture/surface objects: every range, array and resource a
// client names must be its own, whole.
#include <catch2/catch.hpp>

#include <cstring>

#include "proto/ops_copies.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::CopySideKind;
using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kPitch = 512;
constexpr std::uint64_t kRows = 8;

std::byte* device(std::uint64_t dptr) {
  return reinterpret_cast<std::byte*>(dptr);
}

proto::CopySide linear(std::uint64_t dptr, std::uint64_t pitch = kPitch,
                       std::uint64_t height = kRows) {
  return proto::CopySide{dptr, 0, 0, 0, 0, pitch, height, CopySideKind::kDevice, 0};
}

proto::Copy3DReq box(std::uint64_t stream, proto::CopySide src, proto::CopySide dst,
                     std::uint64_t width, std::uint64_t height, std::uint64_t depth = 1) {
  return proto::Copy3DReq{stream, width, height, depth, src, dst};
}

proto::WireResourceDesc resource(std::uint32_t type, std::uint64_t handle, std::uint64_t size = 0,
                                 std::uint64_t width = 0, std::uint64_t height = 0) {
  return proto::WireResourceDesc{type,  0,      handle, CU_AD_FORMAT_FLOAT, 1, size,
                                 width, height, kPitch};
}

proto::ArrayCreateRep make_array(TestClient& client, std::uint64_t ctx, std::uint64_t width,
                                 std::uint64_t height, CUresult* result = nullptr) {
  proto::ArrayCreateReq req{ctx, {width, height, 0, CU_AD_FORMAT_FLOAT, 1, 0, 0}};
  Reply r = client.call(Op::kArrayCreate, req);
  if (result) *result = r.result;
  return r.as<proto::ArrayCreateRep>();
}

TEST_CASE("a 2D copy between the client's allocations moves every row", "[server][copies]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t src = sut.alloc(ctx.ctx, kPitch * kRows);
  std::uint64_t dst = sut.alloc(ctx.ctx, kPitch * kRows);
  for (std::uint64_t i = 0; i < kPitch * kRows; ++i) device(src)[i] = std::byte(i % 251);
  std::memset(device(dst), 0, kPitch * kRows);

  proto::CopySide from = linear(src);
  from.x_bytes = 16;
  from.y = 1;
  Reply r = sut.call(Op::kCopy3D, box(ctx.default_stream, from, linear(dst), 100, kRows - 1));

  REQUIRE(r.result == CUDA_SUCCESS);
  for (std::uint64_t row = 0; row < kRows - 1; ++row) {
    INFO("row " << row);
    CHECK(std::memcmp(device(dst) + row * kPitch, device(src) + (row + 1) * kPitch + 16, 100) == 0);
    CHECK(device(dst)[row * kPitch + 100] == std::byte{0});
  }
}

TEST_CASE("a 2D or 3D copy whose last row leaves the allocation is refused", "[server][copies]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t src = sut.alloc(ctx.ctx, kPitch * kRows);
  std::uint64_t dst = sut.alloc(ctx.ctx, kPitch * kRows);

  // The first row fits; the ninth of a pitch-512 box of 8 rows starting at row 1 does not.
  proto::CopySide from = linear(src);
  from.y = 1;
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, from, linear(dst), 64, kRows)).result ==
        CUDA_ERROR_INVALID_VALUE);
  // A row wider than what is left of the last row.
  proto::CopySide to = linear(dst);
  to.x_bytes = kPitch - 8;
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, linear(src), to, 16, kRows)).result ==
        CUDA_ERROR_INVALID_VALUE);
  // A second slice past the end.
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, linear(src), linear(dst), 64, kRows, 2))
            .result == CUDA_ERROR_INVALID_VALUE);
  // A geometry that overflows 64 bits.
  proto::CopySide huge = linear(src, ~std::uint64_t{0} / 2, 4);
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, huge, linear(dst), 8, 4)).result ==
        CUDA_ERROR_INVALID_VALUE);

  CHECK(fake_gpu().copies_3d == 0);
}

TEST_CASE("a 2D copy from another client's memory is refused", "[server][copies]") {
  Harness h;
  TestClient owner(h, default_hello(1));
  TestClient thief(h, default_hello(2));
  auto owner_ctx = owner.create_context();
  auto thief_ctx = thief.create_context();
  std::uint64_t secret = owner.alloc(owner_ctx.ctx, kPitch * kRows);
  std::uint64_t mine = thief.alloc(thief_ctx.ctx, kPitch * kRows);

  Reply r =
      thief.call(Op::kCopy3D, box(thief_ctx.default_stream, linear(secret), linear(mine), 64, 2));

  CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_gpu().copies_3d == 0);
}

TEST_CASE("a copy of 0 bytes is a no-op whatever its addresses; 1 byte from 0 is refused",
          "[server][copies]") {
  // As the real driver: a 0-byte copy touches nothing (fuzz_ring_records once sent one from
  // address 0, which the fake driver then handed to memmove).
  Harness h;
  TestClient client(h);
  auto ctx = client.create_context();
  const std::uint64_t mine = client.alloc(ctx.ctx, kPitch);
  CHECK(client.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, mine, 0, 0}).result ==
        CUDA_SUCCESS);
  CHECK(client.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, 0, mine, 0}).result ==
        CUDA_SUCCESS);
  CHECK(client.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, mine, 0, 1}).result ==
        CUDA_ERROR_INVALID_VALUE);
  // The session goes on.
  CHECK(client.alloc(ctx.ctx, kPitch) != 0);
}

TEST_CASE("a staged 2D copy hands the chunk back, refused or not", "[server][copies]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dst = sut.alloc(ctx.ctx, kPitch * kRows);
  std::memset(sut.view().chunk(1), 0x3c, 4 * 100);
  proto::CopySide staged{1, 0, 0, 0, 0, 100, 4, CopySideKind::kStagingChunk, 9};

  sut.send(Op::kCopy3D, box(ctx.default_stream, staged, linear(dst), 100, 4));
  REQUIRE(h.pump_until([&] { return sut.view().chunk_state(1)->done_generation.load() == 9; }));
  CHECK(sut.view().chunk_state(1)->result.load() == CUDA_SUCCESS);
  CHECK(device(dst)[3 * kPitch + 99] == std::byte{0x3c});
  CHECK(device(dst)[3 * kPitch + 100] != std::byte{0x3c});

  // Rows past the chunk's end: refused, the chunk handed back with the error.
  const std::uint64_t chunk_bytes = sut.view().geometry.chunk_bytes;
  proto::CopySide too_long{1, 0, 0, 0, 0, chunk_bytes, 4, CopySideKind::kStagingChunk, 10};
  sut.send(Op::kCopy3D, box(ctx.default_stream, too_long, linear(dst), 8, 2));
  REQUIRE(h.pump_until([&] { return sut.view().chunk_state(1)->done_generation.load() == 10; }));
  CHECK(sut.view().chunk_state(1)->result.load() == CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.control()->async_error.load() == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("arrays count against the memory limit and copies stay inside them", "[server][copies]") {
  Harness h;
  auto hello = default_hello();
  hello.device_memory_limit = 2 * kMiB;
  TestClient sut(h, hello);
  auto ctx = sut.create_context();
  CUresult result = CUDA_SUCCESS;

  auto array = make_array(sut, ctx.ctx, 256, 1024, &result);  // 1 MiB of floats
  REQUIRE(result == CUDA_SUCCESS);
  CHECK(array.charged_bytes == kMiB);
  make_array(sut, ctx.ctx, 256, 2048, &result);
  CHECK(result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(h.logged("of a CUDA array; its limit is 2 MiB"));

  std::uint64_t dptr = sut.alloc(ctx.ctx, kPitch * kRows);
  proto::CopySide in_array{array.array, 0, 1020, 1023, 0, 0, 0, CopySideKind::kArray, 0};
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, linear(dptr), in_array, 4, 1)).result ==
        CUDA_SUCCESS);
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, linear(dptr), in_array, 8, 1)).result ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, linear(dptr), in_array, 4, 2)).result ==
        CUDA_ERROR_INVALID_VALUE);
  in_array.handle += 1;
  CHECK(sut.call(Op::kCopy3D, box(ctx.default_stream, linear(dptr), in_array, 4, 1)).result ==
        CUDA_ERROR_INVALID_VALUE);

  CHECK(sut.call(Op::kArrayDestroy, proto::HandleReq{array.array}).result == CUDA_SUCCESS);
  CHECK(h.pump_until([&] { return fake_gpu().arrays_live == 0; }));
  make_array(sut, ctx.ctx, 256, 1536, &result);  // fits only with the first one gone
  CHECK(result == CUDA_SUCCESS);
}

TEST_CASE("texture objects take only the client's own resources", "[server][copies]") {
  Harness h;
  TestClient owner(h, default_hello(1));
  TestClient sut(h, default_hello(2));
  auto owner_ctx = owner.create_context();
  auto ctx = sut.create_context();
  std::uint64_t theirs = owner.alloc(owner_ctx.ctx, kPitch * kRows);
  std::uint64_t mine = sut.alloc(ctx.ctx, kPitch * kRows);
  auto their_array = make_array(owner, owner_ctx.ctx, 16, 16);

  auto pitch2d = [&](std::uint64_t dptr, std::uint64_t rows) {
    proto::TexObjectCreateReq req{};
    req.ctx = ctx.ctx;
    req.resource = resource(CU_RESOURCE_TYPE_PITCH2D, dptr, 0, 128, rows);
    return sut.call(Op::kTexObjectCreate, req);
  };
  Reply ok = pitch2d(mine, kRows);
  REQUIRE(ok.result == CUDA_SUCCESS);
  CHECK(ok.as<proto::TexObjectRep>().value != 0);
  CHECK(pitch2d(mine, kRows + 1).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch2d(theirs, 2).result == CUDA_ERROR_INVALID_VALUE);

  proto::SurfObjectCreateReq surface{ctx.ctx, resource(CU_RESOURCE_TYPE_ARRAY, their_array.array)};
  CHECK(sut.call(Op::kSurfObjectCreate, surface).result == CUDA_ERROR_INVALID_HANDLE);
  proto::SurfObjectCreateReq linear_past{
      ctx.ctx, resource(CU_RESOURCE_TYPE_LINEAR, mine, kPitch * kRows + 4)};
  CHECK(sut.call(Op::kSurfObjectCreate, linear_past).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_gpu().tex_objects_live == 1);

  // A texture id is not a surface id.
  auto id = ok.as<proto::TexObjectRep>().object;
  CHECK(sut.call(Op::kSurfObjectDestroy, proto::HandleReq{id}).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.call(Op::kTexObjectDestroy, proto::HandleReq{id}).result == CUDA_SUCCESS);
  CHECK(h.pump_until([&] { return fake_gpu().tex_objects_live == 0; }));
}

TEST_CASE("a departing client's arrays and texture objects are freed", "[server][copies]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto array = make_array(sut, ctx.ctx, 64, 64);
  proto::TexObjectCreateReq tex{};
  tex.ctx = ctx.ctx;
  tex.resource = resource(CU_RESOURCE_TYPE_ARRAY, array.array);
  REQUIRE(sut.call(Op::kTexObjectCreate, tex).result == CUDA_SUCCESS);
  proto::SurfObjectCreateReq surf{ctx.ctx, resource(CU_RESOURCE_TYPE_ARRAY, array.array)};
  REQUIRE(sut.call(Op::kSurfObjectCreate, surf).result == CUDA_SUCCESS);
  CHECK(fake_gpu().arrays_live == 1);
  CHECK(fake_gpu().tex_objects_live == 2);

  sut.hang_up();

  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  CHECK(fake_gpu().arrays_live == 0);
  CHECK(fake_gpu().tex_objects_live == 0);
  CHECK(h.logged("1 CUDA array, 2 texture/surface objects"));
}

}  // namespace
}  // namespace mpsshim::server::test

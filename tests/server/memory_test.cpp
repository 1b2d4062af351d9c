// Allocations, limits, copies through staging chunks and pinned regions, memsets.
#include <catch2/catch.hpp>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;

std::byte* device(std::uint64_t dptr) {
  return reinterpret_cast<std::byte*>(dptr);
}

TEST_CASE("an allocation beyond the client's limit is refused and logged", "[server][memory]") {
  Harness h;
  auto hello = default_hello(4123, "python3");
  hello.device_memory_limit = 16 * kMiB;
  TestClient sut(h, hello);
  auto ctx = sut.create_context();
  CUresult result = CUDA_SUCCESS;

  CHECK(sut.alloc(ctx.ctx, 10 * kMiB, &result) != 0);
  CHECK(sut.alloc(ctx.ctx, 8 * kMiB, &result) == 0);

  CHECK(result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(
      h.logged("client 1 (pid 4123, python3) asked for 8 MiB of device memory; its limit is "
               "16 MiB (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; raise it in the client's environment) "
               "and it already uses 10 MiB"));
}

TEST_CASE("MemGetInfo reports the client's view of its limit", "[server][memory]") {
  Harness h;
  auto hello = default_hello();
  hello.device_memory_limit = 16 * kMiB;
  TestClient sut(h, hello);
  auto ctx = sut.create_context();
  sut.alloc(ctx.ctx, 4 * kMiB);

  auto info = sut.call_empty(Op::kMemGetInfo).as<proto::MemGetInfoRep>();

  CHECK(info.total_bytes == 16 * kMiB);
  CHECK(info.free_bytes == 12 * kMiB);
}

TEST_CASE("MemFree takes only the base of the client's own allocation", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);

  CHECK(sut.call(Op::kMemFree, proto::MemFreeReq{dptr + 16}).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.call(Op::kMemFree, proto::MemFreeReq{dptr}).result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kMemFree, proto::MemFreeReq{dptr}).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(h.pump_until([&] { return fake_gpu().allocations.count(dptr) == 0; }));
}

TEST_CASE("a freed allocation stays until the client's queued work is done", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  fake_gpu().busy = true;

  sut.call(Op::kMemFree, proto::MemFreeReq{dptr});
  h.pump();
  CHECK(fake_gpu().allocations.count(dptr) == 1);
  CHECK(h.server->stats_text().find("mem_used=0 ") != std::string::npos);

  fake_gpu().busy = false;
  CHECK(h.pump_until([&] { return fake_gpu().allocations.count(dptr) == 0; }));
}

TEST_CASE("another client's memory is out of reach", "[server][memory]") {
  Harness h;
  TestClient owner(h, default_hello(1));
  TestClient thief(h, default_hello(2));
  auto owner_ctx = owner.create_context();
  auto thief_ctx = thief.create_context();
  std::uint64_t theirs = owner.alloc(owner_ctx.ctx, kMiB);
  std::uint64_t mine = thief.alloc(thief_ctx.ctx, kMiB);

  thief.send(Op::kCopyDtoD, proto::CopyDtoDReq{thief_ctx.default_stream, mine, theirs, 64});
  h.pump();
  CHECK(thief.control()->async_error.load() == CUDA_ERROR_INVALID_VALUE);
  CHECK(thief.call(Op::kMemFree, proto::MemFreeReq{theirs}).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_gpu().allocations.count(theirs) == 1);
}

TEST_CASE("a copy that straddles the end of an allocation is refused", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t a = sut.alloc(ctx.ctx, kMiB);
  std::uint64_t b = sut.alloc(ctx.ctx, kMiB);

  auto reply = [&](std::uint64_t dst, std::uint64_t src, std::uint64_t n) {
    return sut.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, dst, src, n}).result;
  };
  CHECK(reply(a, b, kMiB) == CUDA_SUCCESS);
  CHECK(reply(a + 1, b, kMiB) == CUDA_ERROR_INVALID_VALUE);
  CHECK(reply(a, b, 0) == CUDA_SUCCESS);
  CHECK(reply(a, ~std::uint64_t{0} - 4, 16) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("staged copies move bytes and hand the chunk back", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  std::memset(sut.view().chunk(0), 0x5a, 4096);

  proto::CopyHostReq to_device{ctx.default_stream, dptr, 4096,
                               proto::HostRef{0, 0, proto::HostKind::kStagingChunk, 7}};
  sut.send(Op::kCopyHtoD, to_device);
  REQUIRE(h.pump_until([&] { return sut.view().chunk_state(0)->done_generation.load() == 7; }));
  CHECK(sut.view().chunk_state(0)->result.load() == CUDA_SUCCESS);
  CHECK(device(dptr)[4095] == std::byte{0x5a});

  proto::CopyHostReq to_host{ctx.default_stream, dptr + 1024, 1024,
                             proto::HostRef{3, 8, proto::HostKind::kStagingChunk, 1}};
  sut.send(Op::kCopyDtoH, to_host);
  REQUIRE(h.pump_until([&] { return sut.view().chunk_state(3)->done_generation.load() == 1; }));
  CHECK(sut.view().chunk(3)[8] == std::byte{0x5a});
  CHECK(sut.view().chunk(3)[8 + 1023] == std::byte{0x5a});
}

TEST_CASE("a staged copy waits for its DMA before handing the chunk back", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  fake_gpu().busy = true;

  sut.send(Op::kCopyHtoD,
           proto::CopyHostReq{ctx.default_stream, dptr, 16,
                              proto::HostRef{1, 0, proto::HostKind::kStagingChunk, 2}});
  h.pump();
  CHECK(sut.view().chunk_state(1)->done_generation.load() == 0);

  fake_gpu().busy = false;
  CHECK(h.pump_until([&] { return sut.view().chunk_state(1)->done_generation.load() == 2; }));
}

TEST_CASE("a bad staged copy still hands the chunk back, with the error", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  const std::uint64_t chunk_bytes = sut.view().geometry.chunk_bytes;

  sut.send(Op::kCopyHtoD,
           proto::CopyHostReq{ctx.default_stream, 0x1234, 16,
                              proto::HostRef{2, 0, proto::HostKind::kStagingChunk, 5}});
  REQUIRE(h.pump_until([&] { return sut.view().chunk_state(2)->done_generation.load() == 5; }));
  CHECK(sut.view().chunk_state(2)->result.load() == CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.control()->async_error.load() == CUDA_ERROR_INVALID_VALUE);  // a one-way call's error

  std::uint64_t dptr = sut.alloc(ctx.ctx, 4 * chunk_bytes);
  auto past_chunk = sut.call(
      Op::kCopyHtoD, proto::CopyHostReq{ctx.default_stream, dptr, chunk_bytes,
                                        proto::HostRef{2, 1, proto::HostKind::kStagingChunk, 6}});
  CHECK(past_chunk.result == CUDA_ERROR_INVALID_VALUE);
  auto no_such_chunk =
      sut.call(Op::kCopyHtoD,
               proto::CopyHostReq{ctx.default_stream, dptr, 16,
                                  proto::HostRef{9999, 0, proto::HostKind::kStagingChunk, 1}});
  CHECK(no_such_chunk.result == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("pinned host memory is mapped, registered and copied from", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  std::vector<std::byte> content(8192, std::byte{0x33});
  constexpr std::uint32_t kToken = 42;
  sut.send_memfd(proto::MessageKind::kHostMemory, kToken, 8192, content);

  auto reply = sut.call(Op::kHostRegister, proto::HostRegisterReq{0, 8192, kToken, 0});
  REQUIRE(reply.result == CUDA_SUCCESS);
  auto region = reply.as<proto::HostRegisterRep>();
  CHECK(region.device_pointer != 0);
  CHECK(fake_gpu().host_registrations.size() == 2);  // the staging area and this region

  auto copy = sut.call(
      Op::kCopyHtoD,
      proto::CopyHostReq{ctx.default_stream, dptr, 4096,
                         proto::HostRef{region.region, 4096, proto::HostKind::kPinnedRegion, 0}});
  CHECK(copy.result == CUDA_SUCCESS);
  CHECK(device(dptr)[0] == std::byte{0x33});
  auto outside = sut.call(
      Op::kCopyHtoD,
      proto::CopyHostReq{ctx.default_stream, dptr, 4096,
                         proto::HostRef{region.region, 4097, proto::HostKind::kPinnedRegion, 0}});
  CHECK(outside.result == CUDA_ERROR_INVALID_VALUE);
  // The region's device side is the client's memory too (zero-copy access).
  auto dtod = sut.call(Op::kCopyDtoD,
                       proto::CopyDtoDReq{ctx.default_stream, dptr, region.device_pointer, 8192});
  CHECK(dtod.result == CUDA_SUCCESS);

  CHECK(sut.call(Op::kHostUnregister, proto::HostUnregisterReq{region.region}).result ==
        CUDA_SUCCESS);
  CHECK(h.pump_until([&] { return fake_gpu().host_registrations.size() == 1; }));
  CHECK(sut.call(Op::kHostUnregister, proto::HostUnregisterReq{region.region}).result ==
        CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("HostRegister without the memfd, or with a short one, fails", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  sut.create_context();
  CHECK(sut.call(Op::kHostRegister, proto::HostRegisterReq{0, 4096, 1, 0}).result ==
        CUDA_ERROR_INVALID_VALUE);
  sut.send_memfd(proto::MessageKind::kHostMemory, 2, 4096);
  CHECK(sut.call(Op::kHostRegister, proto::HostRegisterReq{0, 8192, 2, 0}).result ==
        CUDA_ERROR_INVALID_VALUE);
  sut.send_memfd(proto::MessageKind::kModuleImage, 3, 4096);
  CHECK(sut.call(Op::kHostRegister, proto::HostRegisterReq{0, 4096, 3, 0}).result ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(h.server->find_session(sut.welcome().client_id) != nullptr);
}

TEST_CASE("memsets cover the whole pitched range or nothing", "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, 4096);
  auto memset = [&](std::uint64_t pitch, std::uint64_t width, std::uint64_t height,
                    std::uint32_t element) {
    return sut
        .call(Op::kMemset,
              proto::MemsetReq{ctx.default_stream, dptr, pitch, width, height, 0x01020304, element})
        .result;
  };

  CHECK(memset(0, 1024, 1, 4) == CUDA_SUCCESS);
  CHECK(device(dptr)[4095] == std::byte{0x01});
  CHECK(memset(0, 1025, 1, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(memset(0, 2048, 1, 2) == CUDA_SUCCESS);
  CHECK(memset(0, 4096, 1, 1) == CUDA_SUCCESS);
  CHECK(memset(0, 16, 1, 3) == CUDA_ERROR_INVALID_VALUE);
  CHECK(memset(0, 16, 2, 1) == CUDA_ERROR_INVALID_VALUE);  // 1-D has one row
  CHECK(memset(1024, 64, 4, 1) == CUDA_SUCCESS);           // last row ends at 3136
  CHECK(memset(1024, 64, 5, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(memset(32, 64, 2, 1) == CUDA_ERROR_INVALID_VALUE);  // rows wider than the pitch
  CHECK(memset(~std::uint64_t{0} / 2, 1, 3, 1) == CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace mpsshim::server::test

namespace mpsshim::server::test {
namespace {

TEST_CASE("a staged copy that fails on the GPU reports at the next synchronizing call",
          "[server][memory]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, 1 << 20);
  fake_gpu().busy = true;
  sut.send(proto::Op::kCopyDtoH,
           proto::CopyHostReq{ctx.default_stream, dptr, 16,
                              proto::HostRef{4, 0, proto::HostKind::kStagingChunk, 3}});
  h.pump();

  fake_gpu().busy = false;
  fake_gpu().work_result = CUDA_ERROR_NOT_PERMITTED;  // not sticky

  REQUIRE(h.pump_until([&] { return sut.view().chunk_state(4)->done_generation.load() == 3; }));
  CHECK(sut.view().chunk_state(4)->result.load() == CUDA_ERROR_NOT_PERMITTED);
  CHECK(sut.control()->async_error.load() == CUDA_ERROR_NOT_PERMITTED);
  CHECK(h.fatal_code == -1);
}

}  // namespace
}  // namespace mpsshim::server::test

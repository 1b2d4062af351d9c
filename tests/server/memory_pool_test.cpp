// Stream-ordered allocation: every client allocates from pools of its own, within its limit,
// and what it allocates is its memory until it frees it in stream order or goes away.
#include <catch2/catch.hpp>

#include "tests/server/fake_async.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;
constexpr proto::WireHandle kDefaultPool = 0;

Reply alloc_async(TestClient& client, std::uint64_t stream, std::uint64_t bytes,
                  proto::WireHandle pool = kDefaultPool) {
  return client.call(Op::kMemAllocAsync, proto::MemAllocAsyncReq{pool, stream, bytes});
}

std::uint64_t pool_attribute(TestClient& client, proto::WireHandle pool,
                             CUmemPool_attribute attribute, CUresult* result = nullptr) {
  auto reply =
      client.call(Op::kMemPoolGetAttribute,
                  proto::MemPoolAttributeReq{pool, static_cast<std::uint32_t>(attribute), 0, 0});
  if (result != nullptr) *result = reply.result;
  return reply.as<proto::MemPoolAttributeRep>().value;
}

CUresult next_async_error(TestClient& client) {
  return static_cast<CUresult>(client.control()->async_error.exchange(0));
}

TEST_CASE("each client allocates from a pool of its own, bounded by its limit", "[server][pools]") {
  Harness h;
  auto hello = default_hello(1, "first");
  hello.device_memory_limit = 100 * kMiB;
  TestClient first(h, hello);
  TestClient second(h, default_hello(2, "second"));
  auto ctx1 = first.create_context();
  auto ctx2 = second.create_context();

  auto a = alloc_async(first, ctx1.default_stream, kMiB);
  auto b = alloc_async(second, ctx2.default_stream, kMiB);

  REQUIRE(a.result == CUDA_SUCCESS);
  REQUIRE(b.result == CUDA_SUCCESS);
  REQUIRE(fake_async().pools.size() == 2);
  CUmemoryPool pool_of_first = fake_async().pool_of.at(a.as<proto::MemAllocRep>().dptr);
  CUmemoryPool pool_of_second = fake_async().pool_of.at(b.as<proto::MemAllocRep>().dptr);
  CHECK(pool_of_first != pool_of_second);
  const CUmemPoolProps& props = fake_async().pools.at(pool_of_first).props;
  CHECK(props.location.type == CU_MEM_LOCATION_TYPE_DEVICE);
  CHECK(props.handleTypes == CU_MEM_HANDLE_TYPE_NONE);
  CHECK(props.maxSize == 100 * kMiB);  // the client's limit (a multiple of 2 MiB already)
  CHECK(fake_async().pools.at(pool_of_second).props.maxSize == 0);  // no limit: the driver's
}

TEST_CASE("an async allocation beyond the client's limit is refused and logged",
          "[server][pools]") {
  Harness h;
  auto hello = default_hello(4123, "python3");
  hello.device_memory_limit = 16 * kMiB;
  TestClient sut(h, hello);
  auto ctx = sut.create_context();

  CHECK(alloc_async(sut, ctx.default_stream, 10 * kMiB).result == CUDA_SUCCESS);
  CHECK(sut.alloc(ctx.ctx, 4 * kMiB) != 0);  // plain and pool memory count together
  auto refused = alloc_async(sut, ctx.default_stream, 4 * kMiB);

  CHECK(refused.result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(
      h.logged("client 1 (pid 4123, python3) asked for 4 MiB of device memory "
               "(cudaMallocAsync); its limit is 16 MiB (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; raise "
               "it in the client's environment) and it already uses 14 MiB"));
}

TEST_CASE("async memory is the client's until its stream-ordered free", "[server][pools]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto reply = alloc_async(sut, ctx.default_stream, kMiB);
  REQUIRE(reply.result == CUDA_SUCCESS);
  const std::uint64_t dptr = reply.as<proto::MemAllocRep>().dptr;

  sut.send(Op::kMemset, proto::MemsetReq{ctx.default_stream, dptr, 0, kMiB, 1, 0x5a, 1});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_SUCCESS);
  CHECK(*reinterpret_cast<const std::uint8_t*>(dptr + kMiB - 1) == 0x5a);

  sut.send(Op::kMemFreeAsync, proto::MemFreeAsyncReq{dptr, ctx.default_stream});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_SUCCESS);
  CHECK(fake_async().frees_async == 1);
  CHECK(h.server->stats_text().find("mem_used=0 ") != std::string::npos);

  sut.send(Op::kMemset, proto::MemsetReq{ctx.default_stream, dptr, 0, 16, 1, 0, 1});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_ERROR_INVALID_VALUE);  // no longer the client's
  sut.send(Op::kMemFreeAsync, proto::MemFreeAsyncReq{dptr, ctx.default_stream});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_ERROR_INVALID_VALUE);  // freed twice
  CHECK(fake_async().frees_async == 1);
}

TEST_CASE("another client's async memory cannot be freed or touched", "[server][pools]") {
  Harness h;
  TestClient owner(h, default_hello(1, "owner"));
  TestClient thief(h, default_hello(2, "thief"));
  auto owner_ctx = owner.create_context();
  auto thief_ctx = thief.create_context();
  const std::uint64_t dptr =
      alloc_async(owner, owner_ctx.default_stream, kMiB).as<proto::MemAllocRep>().dptr;

  thief.send(Op::kMemFreeAsync, proto::MemFreeAsyncReq{dptr, thief_ctx.default_stream});
  h.pump();

  CHECK(next_async_error(thief) == CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_async().frees_async == 0);
}

TEST_CASE("pool attributes come from the client's own pool", "[server][pools]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  REQUIRE(alloc_async(sut, ctx.default_stream, 3 * kMiB).result == CUDA_SUCCESS);

  CHECK(pool_attribute(sut, kDefaultPool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 3 * kMiB);
  auto set = sut.call(
      Op::kMemPoolSetAttribute,
      proto::MemPoolAttributeReq{kDefaultPool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0, 64 * kMiB});
  CHECK(set.result == CUDA_SUCCESS);
  CHECK(pool_attribute(sut, kDefaultPool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 64 * kMiB);
  CHECK(pool_attribute(sut, kDefaultPool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) == 1);
  CUresult result = CUDA_SUCCESS;
  pool_attribute(sut, kDefaultPool, static_cast<CUmemPool_attribute>(99), &result);
  CHECK(result == CUDA_ERROR_INVALID_VALUE);
  auto read_only =
      sut.call(Op::kMemPoolSetAttribute,
               proto::MemPoolAttributeReq{kDefaultPool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0, 0});
  CHECK(read_only.result == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("a created pool serves allocations; only it can be destroyed", "[server][pools]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto created = sut.call(Op::kMemPoolCreate, proto::MemPoolCreateReq{8 * kMiB, 0, 0});
  REQUIRE(created.result == CUDA_SUCCESS);
  const proto::WireHandle pool = created.as<proto::MemPoolCreateRep>().pool;

  auto reply = alloc_async(sut, ctx.default_stream, kMiB, pool);
  REQUIRE(reply.result == CUDA_SUCCESS);
  CHECK(alloc_async(sut, ctx.default_stream, 8 * kMiB, pool).result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(pool_attribute(sut, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == kMiB);

  sut.send(Op::kMemPoolDestroy, proto::HandleReq{kDefaultPool});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_ERROR_INVALID_VALUE);
  sut.send(Op::kMemPoolDestroy, proto::HandleReq{pool});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_SUCCESS);
  CHECK(alloc_async(sut, ctx.default_stream, kMiB, pool).result == CUDA_ERROR_INVALID_VALUE);

  // Its outstanding allocation is still the client's, and freed in stream order.
  const std::uint64_t dptr = reply.as<proto::MemAllocRep>().dptr;
  sut.send(Op::kMemFreeAsync, proto::MemFreeAsyncReq{dptr, ctx.default_stream});
  h.pump();
  CHECK(next_async_error(sut) == CUDA_SUCCESS);
  CHECK(fake_async().frees_async == 1);
}

TEST_CASE("cuMemFree takes async memory too", "[server][pools]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  const std::uint64_t dptr =
      alloc_async(sut, ctx.default_stream, kMiB).as<proto::MemAllocRep>().dptr;

  CHECK(sut.call(Op::kMemFree, proto::MemFreeReq{dptr}).result == CUDA_SUCCESS);
  CHECK(h.pump_until([&] { return fake_gpu().allocations.count(dptr) == 0; }));
}

TEST_CASE("a departed client's pool memory and pools are freed", "[server][pools]") {
  Harness h;
  auto sut = std::make_unique<TestClient>(h);
  auto ctx = sut->create_context();
  REQUIRE(alloc_async(*sut, ctx.default_stream, kMiB).result == CUDA_SUCCESS);
  auto created = sut->call(Op::kMemPoolCreate, proto::MemPoolCreateReq{0, 0, 0});
  const proto::WireHandle pool = created.as<proto::MemPoolCreateRep>().pool;
  REQUIRE(alloc_async(*sut, ctx.default_stream, 2 * kMiB, pool).result == CUDA_SUCCESS);
  REQUIRE(fake_async().pools_live == 2);

  sut->hang_up();

  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  CHECK(fake_gpu().allocations.empty());
  CHECK(fake_async().pools_live == 0);
  CHECK(h.logged("2 allocations (3 MiB)"));
}

}  // namespace
}  // namespace mpsshim::server::test

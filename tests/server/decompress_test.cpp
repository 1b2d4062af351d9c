// cuMemBatchDecompressAsync through the server, on the test driver with a decompression engine
// standing in for a Blackwell's (an H200's driver refuses every call: the shim answers that
// itself, tests/e2e): every address must be the client's own memory, the driver sees the
// operations as sent on the client's stream, and its errorIndex comes back.
#include <catch2/catch.hpp>

#include <limits>
#include <span>
#include <vector>

#include "proto/ops_driver_extras.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kNotAboutOne = proto::kDecompressNotAboutOne;

std::vector<CUmemDecompressParams> g_seen;
int g_calls = 0;

const DriverTable& engine_driver() {
  static const DriverTable table = [] {
    DriverTable t = test_driver();
    t.cuMemBatchDecompressAsync = [](CUmemDecompressParams* params, size_t count, unsigned flags,
                                     size_t* index, CUstream) {
      ++g_calls;
      g_seen.assign(params, params + count);
      if (flags == 5) return CUDA_ERROR_INVALID_VALUE;  // an error about no operation
      if (flags != 0) {  // the driver's own check, naming an operation
        *index = 1;
        return CUDA_ERROR_INVALID_VALUE;
      }
      return CUDA_SUCCESS;
    };
    return t;
  }();
  return table;
}

}  // namespace

TEST_CASE("decompressions name only the client's memory; the driver's errorIndex comes back",
          "[server][decompress]") {
  Harness h(engine_driver(), ServerSettings{});
  TestClient sut(h, default_hello(1));
  TestClient other(h, default_hello(2));
  auto ctx = sut.create_context();
  auto other_ctx = other.create_context();
  const std::uint64_t src = sut.alloc(ctx.ctx, kMiB);
  const std::uint64_t dst = sut.alloc(ctx.ctx, kMiB);
  const std::uint64_t theirs = other.alloc(other_ctx.ctx, kMiB);
  std::vector<proto::WireDecompressParams> ops{
      {4096, 65536, dst + kMiB - 8, src, dst, CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE, 0},
      {512, 4096, dst + kMiB - 4, src + 8192, dst + 65536, CU_MEM_DECOMPRESS_ALGORITHM_LZ4, 0}};
  auto send = [&](std::uint32_t flags) {
    return sut.call(Op::kMemDecompress, proto::MemDecompressReq{ctx.default_stream, 2, flags},
                    std::as_bytes(std::span(ops)));
  };

  g_calls = 0;
  auto done = send(0);
  CHECK(done.result == CUDA_SUCCESS);
  REQUIRE(g_seen.size() == 2);
  CHECK(reinterpret_cast<std::uint64_t>(g_seen[1].dst) == dst + 65536);
  CHECK(reinterpret_cast<std::uint64_t>(g_seen[1].dstActBytes) == dst + kMiB - 4);
  CHECK(g_seen[1].srcNumBytes == 512);
  CHECK(g_seen[1].algo == CU_MEM_DECOMPRESS_ALGORITHM_LZ4);

  auto refused = send(3);  // the driver's error about operation 1
  CHECK(refused.result == CUDA_ERROR_INVALID_VALUE);
  CHECK(refused.as<proto::MemDecompressRep>().error_index == 1);
  auto untouched = send(5);  // the driver left errorIndex alone: the client's stays so too
  CHECK(untouched.result == CUDA_ERROR_INVALID_VALUE);
  CHECK(untouched.as<proto::MemDecompressRep>().error_index == proto::kDecompressIndexUnset);

  for (std::uint64_t proto::WireDecompressParams::*field :
       {&proto::WireDecompressParams::src, &proto::WireDecompressParams::dst,
        &proto::WireDecompressParams::dst_act_bytes}) {
    auto saved = ops[1];
    ops[1].*field = theirs;
    const int calls = g_calls;
    auto foreign = send(0);
    ops[1] = saved;
    CHECK(foreign.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(foreign.as<proto::MemDecompressRep>().error_index == 1);
    CHECK(g_calls == calls);  // the driver never saw it
  }
  ops[0].src_bytes = 2 * kMiB;  // past the end of the client's allocation
  CHECK(send(0).as<proto::MemDecompressRep>().error_index == 0);
  ops[0].src_bytes = 4096;

  auto empty = sut.call(Op::kMemDecompress, proto::MemDecompressReq{ctx.default_stream, 0, 0});
  CHECK(empty.result == CUDA_ERROR_INVALID_VALUE);
  CHECK(empty.as<proto::MemDecompressRep>().error_index == kNotAboutOne);
  // A count the record does not hold ends the session, never the server.
  sut.send(Op::kMemDecompress, proto::MemDecompressReq{ctx.default_stream, 3, 0}, 0,
           std::as_bytes(std::span(ops)));
  CHECK(h.pump_until([&] { return sut.control()->fault.load() == CUDA_ERROR_MPS_RPC_FAILURE; }));
  CHECK(other.call(Op::kStreamQuery, proto::HandleReq{other_ctx.default_stream}).result ==
        CUDA_SUCCESS);
}

}  // namespace mpsshim::server::test

// A client's own green contexts through the server on the test driver (ops/green_context.cpp,
// docs/green-contexts.md): only resources the server handed out come back; a split longer than
// one answer is paged from one driver call, so outputs of different pages combine; descriptors
// and green contexts refuse what the driver refuses.
#include <catch2/catch.hpp>

#include <cstring>
#include <span>
#include <vector>

#include "proto/ops_green.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;

proto::DevResource quota_resource(TestClient& client) {
  auto reply =
      client.call(Op::kGreenResource, proto::GreenResourceReq{0, CU_DEV_RESOURCE_TYPE_SM, 0});
  REQUIRE(reply.result == CUDA_SUCCESS);
  return reply.as<proto::DevResource>();
}

unsigned sm_count(const proto::DevResource& r) {
  CUdevResource resource{};
  std::memcpy(&resource, r.bytes, sizeof resource);
  return resource.sm.smCount;
}

}  // namespace

TEST_CASE("a client's green contexts: forged resources refused, long splits paged from one call",
          "[server][green]") {
  Harness h(test_driver(), ServerSettings{});
  TestClient sut(h);
  const proto::DevResource quota = quota_resource(sut);
  REQUIRE(sm_count(quota) == 132);

  proto::DevResource forged = quota;
  forged.bytes[40] ^= 0x5a;  // an opaque byte: other SMs, as far as the driver can tell
  auto split = [&](const proto::DevResource& input, std::uint32_t groups, std::uint32_t min,
                   std::uint32_t flags, std::uint32_t first) {
    return sut.call(Op::kGreenSplit, proto::GreenSplitReq{input, groups, min, flags, first});
  };
  CHECK(split(forged, 2, 8, 0, 0).result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  auto desc_of = [&](std::vector<proto::DevResource> resources) {
    return sut.call(Op::kGreenDesc,
                    proto::GreenDescReq{static_cast<std::uint32_t>(resources.size()), 0},
                    std::as_bytes(std::span(resources)));
  };
  CHECK(desc_of({forged}).result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);

  // Pairs of SMs: 66 groups, three answers.
  constexpr auto kPairs = CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING;
  auto counted = split(quota, 0, 2, kPairs, 0);
  REQUIRE(counted.result == CUDA_SUCCESS);
  CHECK(counted.as<proto::GreenSplitRep>().groups == 66);
  std::vector<proto::DevResource> all;
  for (std::uint32_t first = 0; first < 66;) {
    auto page = split(quota, 2000, 2, kPairs, first);
    REQUIRE(page.result == CUDA_SUCCESS);
    const auto rep = page.as<proto::GreenSplitRep>();
    CHECK(rep.groups == 66);
    REQUIRE(rep.count > 0);
    for (std::uint32_t i = 0; i < rep.count; ++i) all.push_back(rep.result[i]);
    first += rep.count;
  }
  REQUIRE(all.size() == 66);
  CHECK(sm_count(all[65]) == 2);
  // Outputs of the first and the last page are of one split: one descriptor takes both.
  auto combined = desc_of({all[0], all[65]});
  REQUIRE(combined.result == CUDA_SUCCESS);
  const std::uint64_t desc = combined.as<proto::GreenDescRep>().desc;
  // A later page of a split never asked is refused, not split again.
  CHECK(split(quota, 4, 8, 0, 2).result == CUDA_ERROR_INVALID_VALUE);

  // Two long splits paged in turn, as two threads of the client would: each page is of its own
  // split (pairs: 66 groups; fours: 33).
  auto page_of = [&](std::uint32_t min, std::uint32_t first) {
    auto page = split(quota, 2000, min, kPairs, first);
    REQUIRE(page.result == CUDA_SUCCESS);
    return page.as<proto::GreenSplitRep>();
  };
  const auto pairs_0 = page_of(2, 0);
  const auto fours_0 = page_of(4, 0);
  const auto pairs_1 = page_of(2, proto::kGreenSplitPage);
  const auto fours_1 = page_of(4, proto::kGreenSplitPage);
  CHECK(pairs_0.groups == 66);
  CHECK(fours_0.groups == 33);
  CHECK(pairs_1.count == proto::kGreenSplitPage);
  CHECK(fours_1.count == 33 - proto::kGreenSplitPage);
  CHECK(sm_count(pairs_1.result[0]) == 2);
  CHECK(sm_count(fours_1.result[0]) == 4);
  CHECK(desc_of({pairs_0.result[0], pairs_1.result[0]}).result == CUDA_SUCCESS);
  CHECK(desc_of({fours_0.result[0], fours_1.result[0]}).result == CUDA_SUCCESS);

  auto create = [&](std::uint64_t d, std::uint32_t flags) {
    return sut.call(Op::kGreenCtxCreate, proto::GreenCtxCreateReq{d, flags, 0});
  };
  CHECK(create(desc, 0).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(create(desc + 100, CU_GREEN_CTX_DEFAULT_STREAM).result == CUDA_ERROR_INVALID_VALUE);
  auto made = create(desc, CU_GREEN_CTX_DEFAULT_STREAM);
  REQUIRE(made.result == CUDA_SUCCESS);
  const auto green = made.as<proto::GreenCtxCreateRep>();
  CHECK(green.sm_count == 4);
  auto own =
      sut.call(Op::kGreenResource, proto::GreenResourceReq{green.ctx, CU_DEV_RESOURCE_TYPE_SM, 0});
  REQUIRE(own.result == CUDA_SUCCESS);
  CHECK(sm_count(own.as<proto::DevResource>()) == 4);
  CHECK(sut.call(Op::kGreenResource, proto::GreenResourceReq{green.ctx, 0, 0}).result ==
        CUDA_ERROR_INVALID_RESOURCE_TYPE);
  // Its streams are made in it; the context goes with cuCtxDestroy's record.
  auto stream =
      sut.call(Op::kStreamCreate, proto::StreamCreateReq{green.ctx, CU_STREAM_NON_BLOCKING, 0});
  CHECK(stream.result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kCtxDestroy, proto::CtxReq{green.ctx}).result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{stream.as<proto::StreamCreateRep>().stream})
            .result == CUDA_ERROR_INVALID_HANDLE);
}

}  // namespace mpsshim::server::test

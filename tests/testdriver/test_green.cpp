// SM resources split like the real driver's (measured on an H200), and green contexts whose
// streams run on their SMs only.
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr unsigned kSms = 132;
constexpr unsigned kIgnoreCoscheduling = CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING;

struct Split {
  std::vector<CUdevResource> groups;
  CUdevResource remaining{};
};

Split split(unsigned min_count, unsigned flags, unsigned want = 200) {
  const auto& sut = driver().api;
  CUdevResource all{};
  REQUIRE_CU(sut.cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
  Split out;
  out.groups.resize(want);
  unsigned made = want;
  REQUIRE_CU(sut.cuDevSmResourceSplitByCount(out.groups.data(), &made, &all, &out.remaining, flags,
                                             min_count));
  out.groups.resize(made);
  return out;
}

// Distinct SM ids that record_smid reports for `blocks` blocks on `stream`.
std::set<unsigned> sms_seen(Session& s, CUstream stream, int blocks) {
  CUdeviceptr out = s.alloc(sizeof(unsigned) * static_cast<std::size_t>(blocks));
  void* params[] = {&out};
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("record_smid"), static_cast<unsigned>(blocks), 1, 1,
                                  32, 1, 1, 0, stream, params, nullptr));
  REQUIRE_CU(s.sut.cuStreamSynchronize(stream));
  const auto ids = s.download<unsigned>(out, static_cast<std::size_t>(blocks));
  REQUIRE_CU(s.sut.cuMemFree_v2(out));
  return {ids.begin(), ids.end()};
}

TEST_CASE("the device's SM resource", "[green]") {
  Session s;
  CUdevResource all{};
  REQUIRE_CU(s.sut.cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(all.type == CU_DEV_RESOURCE_TYPE_SM);
  CHECK(all.sm.smCount == kSms);
  CHECK(all.sm.minSmPartitionSize == 8);
  CHECK(all.sm.smCoscheduledAlignment == 8);
  CHECK_CU(s.sut.cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_INVALID),
           CUDA_ERROR_INVALID_RESOURCE_TYPE);
}

TEST_CASE("splits match the measured H200", "[green]") {
  Session s;
  SECTION("co-scheduled groups of 8 never straddle GPCs: 15 groups and 12 left") {
    const Split sut = split(8, 0);
    CHECK(sut.groups.size() == 15);
    CHECK(sut.groups[0].sm.smCount == 8);
    CHECK(sut.remaining.sm.smCount == 12);
    // Outputs answer 0 in both size fields, as on the H200 (tools/probes/green_nested.cu).
    CHECK(sut.groups[0].sm.minSmPartitionSize == 0);
    CHECK(sut.remaining.sm.smCoscheduledAlignment == 0);
  }
  SECTION("ignoring co-scheduling: groups of 2, 4 and 8") {
    CHECK(split(1, kIgnoreCoscheduling).groups.size() == 66);
    CHECK(split(2, kIgnoreCoscheduling).groups.size() == 66);
    CHECK(split(4, kIgnoreCoscheduling).groups.size() == 33);
    const Split eights = split(8, kIgnoreCoscheduling);
    CHECK(eights.groups.size() == 16);
    CHECK(eights.remaining.sm.smCount == 4);
  }
  SECTION("a minimum is rounded up to the granularity") {
    const Split quarter = split(33, kIgnoreCoscheduling);
    CHECK(quarter.groups.size() == 3);
    CHECK(quarter.groups[0].sm.smCount == 34);
    CHECK(split(9, 0).groups[0].sm.smCount == 16);
  }
  SECTION("asking for fewer groups leaves more remaining") {
    const Split two = split(8, 0, 2);
    CHECK(two.groups.size() == 2);
    CHECK(two.remaining.sm.smCount == kSms - 16);
  }
  SECTION("a NULL result only counts") {
    CUdevResource all{};
    REQUIRE_CU(s.sut.cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned count = 0;
    REQUIRE_CU(s.sut.cuDevSmResourceSplitByCount(nullptr, &count, &all, nullptr, 0, 8));
    CHECK(count == 15);
    CHECK_CU(s.sut.cuDevSmResourceSplitByCount(nullptr, &count, &all, nullptr, 0, kSms + 1),
             CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("outputs of a split cannot be split again") {
    Split first = split(8, 0);
    CUdevResource again[4];
    unsigned count = 4;
    CHECK_CU(s.sut.cuDevSmResourceSplitByCount(again, &count, &first.groups[0], nullptr, 0, 2),
             CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  }
}

TEST_CASE("a descriptor combines groups of one split", "[green]") {
  Session s;
  Split a = split(8, 0);
  Split b = split(8, 0);
  CUdevResourceDesc desc = nullptr;
  REQUIRE_CU(s.sut.cuDevResourceGenerateDesc(&desc, a.groups.data(), 2));
  CUdevResource mixed[] = {a.groups[0], b.groups[1]};
  CHECK_CU(s.sut.cuDevResourceGenerateDesc(&desc, mixed, 2),
           CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
}

TEST_CASE("a green context's streams run on its SMs", "[green]") {
  Session s;
  const int live_before = driver().live_objects();
  const GreenStream quarter = make_green_stream(0, 33, 1, kIgnoreCoscheduling);
  CHECK(driver().live_objects() == live_before + 2);
  CHECK(quarter.sm_count == 34);

  CHECK(sms_seen(s, quarter.stream, 4 * static_cast<int>(kSms)).size() == 34);
  CHECK(sms_seen(s, s.stream, 4 * static_cast<int>(kSms)).size() == kSms);

  destroy_green_stream(quarter);
  CHECK(driver().live_objects() == live_before);
}

TEST_CASE("green contexts may overlap", "[green]") {
  Session s;
  Split groups = split(8, 0);
  CUdevResourceDesc first_two = nullptr, second_and_third = nullptr;
  REQUIRE_CU(s.sut.cuDevResourceGenerateDesc(&first_two, groups.groups.data(), 2));
  REQUIRE_CU(s.sut.cuDevResourceGenerateDesc(&second_and_third, groups.groups.data() + 1, 2));
  CUgreenCtx g1 = nullptr, g2 = nullptr, g3 = nullptr;
  REQUIRE_CU(s.sut.cuGreenCtxCreate(&g1, first_two, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  REQUIRE_CU(s.sut.cuGreenCtxCreate(&g2, second_and_third, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  REQUIRE_CU(s.sut.cuGreenCtxCreate(&g3, first_two, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream st1 = nullptr, st2 = nullptr;
  REQUIRE_CU(s.sut.cuGreenCtxStreamCreate(&st1, g1, CU_STREAM_NON_BLOCKING, -10));
  REQUIRE_CU(s.sut.cuGreenCtxStreamCreate(&st2, g2, CU_STREAM_NON_BLOCKING, 0));

  const std::set<unsigned> one = sms_seen(s, st1, 64);
  const std::set<unsigned> two = sms_seen(s, st2, 64);
  CHECK(one.size() == 16);
  CHECK(two.size() == 16);
  std::vector<unsigned> shared;
  std::set_intersection(one.begin(), one.end(), two.begin(), two.end(), std::back_inserter(shared));
  CHECK(shared.size() == 8);

  REQUIRE_CU(s.sut.cuStreamDestroy_v2(st1));
  REQUIRE_CU(s.sut.cuStreamDestroy_v2(st2));
  for (CUgreenCtx g : {g1, g2, g3}) REQUIRE_CU(s.sut.cuGreenCtxDestroy(g));
}

TEST_CASE("green contexts and their streams insist on the required flags", "[green]") {
  Session s;
  CUdevResource all{};
  REQUIRE_CU(s.sut.cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResourceDesc desc = nullptr;
  REQUIRE_CU(s.sut.cuDevResourceGenerateDesc(&desc, &all, 1));
  CUgreenCtx g = nullptr;
  CHECK_CU(s.sut.cuGreenCtxCreate(&g, desc, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuGreenCtxCreate(&g, desc, 1, CU_GREEN_CTX_DEFAULT_STREAM),
           CUDA_ERROR_INVALID_VALUE);  // the descriptor is device 0's
  REQUIRE_CU(s.sut.cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream st = nullptr;
  CHECK_CU(s.sut.cuGreenCtxStreamCreate(&st, g, CU_STREAM_DEFAULT, 0), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGreenCtxDestroy(g));
  CHECK_CU(s.sut.cuGreenCtxStreamCreate(&st, g, CU_STREAM_NON_BLOCKING, 0),
           CUDA_ERROR_INVALID_CONTEXT);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

#include "broker/server/scheduling/quota.hpp"

#include <cuda.h>

#include <catch2/catch.hpp>

#include "broker/server/scheduling/green_context.hpp"

namespace mpsshim::server {
namespace {

constexpr unsigned kH100Sms = 132;
constexpr unsigned kH100MinPartition = 8;
constexpr unsigned kH100Alignment = 8;

unsigned granularity(bool ignore_coscheduling) {
  return sm_granularity(kH100MinPartition, kH100Alignment, ignore_coscheduling);
}

TEST_CASE("the granularity is 8 SMs on Hopper, 2 when co-scheduling is ignored",
          "[server][quota]") {
  CHECK(granularity(false) == 8);
  CHECK(granularity(true) == 2);
}

TEST_CASE("25% of 132 SMs is 40 in 8-SM groups", "[server][quota]") {
  SmQuota sut = plan_sm_quota(kH100Sms, granularity(false), 25, false);
  CHECK_FALSE(sut.whole_device);
  CHECK(sut.target == 40);
  CHECK(sut.split_flags == 0);
}

TEST_CASE("25% of 132 SMs is 34 in 2-SM groups", "[server][quota]") {
  SmQuota sut = plan_sm_quota(kH100Sms, granularity(true), 25, true);
  CHECK_FALSE(sut.whole_device);
  CHECK(sut.target == 34);
  CHECK(sut.split_flags == CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING);
}

TEST_CASE("1% is one group", "[server][quota]") {
  CHECK(plan_sm_quota(kH100Sms, granularity(false), 1, false).target == 8);
  CHECK(plan_sm_quota(kH100Sms, granularity(true), 1, true).target == 2);
}

TEST_CASE("100% is the whole device, without a split", "[server][quota]") {
  SmQuota sut = plan_sm_quota(kH100Sms, granularity(false), 100, false);
  CHECK(sut.whole_device);
  CHECK(sut.target == kH100Sms);
}

TEST_CASE("a share that rounds up past the device is the whole device", "[server][quota]") {
  CHECK(plan_sm_quota(kH100Sms, granularity(false), 97, false).whole_device);   // 129 -> 136
  SmQuota just_under = plan_sm_quota(kH100Sms, granularity(false), 96, false);  // 127 -> 128
  CHECK_FALSE(just_under.whole_device);
  CHECK(just_under.target == 128);
}

TEST_CASE("out-of-range percentages are clamped", "[server][quota]") {
  CHECK(plan_sm_quota(kH100Sms, granularity(false), 0, false).target == 8);
  CHECK(plan_sm_quota(kH100Sms, granularity(false), -5, false).target == 8);
  CHECK(plan_sm_quota(kH100Sms, granularity(false), 250, false).whole_device);
}

}  // namespace
}  // namespace mpsshim::server

TEST_CASE("a slot's SM groups start at its part of the device and fit on it", "[server][quota]") {
  constexpr unsigned kGroups = 16;  // 132 SMs in groups of 8
  constexpr unsigned kNeeded = 5;   // 25% -> 40 SMs
  CHECK(mpsshim::server::first_group_of_slot(0, 4, kGroups, kNeeded) == 0);
  CHECK(mpsshim::server::first_group_of_slot(1, 4, kGroups, kNeeded) == 4);
  CHECK(mpsshim::server::first_group_of_slot(2, 4, kGroups, kNeeded) == 8);
  // The last slot's run would pass the end: it is moved back to fit.
  CHECK(mpsshim::server::first_group_of_slot(3, 4, kGroups, kNeeded) == kGroups - kNeeded);
  CHECK(mpsshim::server::first_group_of_slot(0, 0, kGroups, kNeeded) == 0);  // no placement
  CHECK(mpsshim::server::first_group_of_slot(3, 4, kGroups, kGroups) == 0);  // the whole device
}

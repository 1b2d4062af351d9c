// libshim/wait_policy.cpp: how a thread waiting for the server spends the wait, by its
// context's scheduling flags and MPSSHIM_WAIT_SPIN_US.
#include "libshim/wait_policy.hpp"

#include <cuda.h>

#include <catch2/catch.hpp>

#include "proto/segment.hpp"

namespace mpsshim::shim {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

constexpr auto kForever = nanoseconds::max();

}  // namespace

TEST_CASE("AUTO spins, yields for the process's budget, then sleeps", "[wait_policy]") {
  const WaitPlan plan = wait_plan_for(CU_CTX_SCHED_AUTO, milliseconds(20));
  CHECK(plan.busy == kBusySpin);
  CHECK(plan.spin_total == milliseconds(20));
  CHECK(plan.paced);
  // Other context flags do not change the plan.
  const WaitPlan mapped = wait_plan_for(CU_CTX_SCHED_AUTO | CU_CTX_MAP_HOST, milliseconds(20));
  CHECK(mapped.busy == plan.busy);
  CHECK(mapped.spin_total == plan.spin_total);
}

TEST_CASE("AUTO with a budget under the busy spin waits as a blocking-sync context does",
          "[wait_policy]") {
  const WaitPlan blocking = wait_plan_for(CU_CTX_SCHED_BLOCKING_SYNC, milliseconds(20));
  CHECK(blocking.busy == kBusySpin);
  CHECK(blocking.spin_total == kBusySpin);
  CHECK(blocking.paced);
  for (nanoseconds budget : {nanoseconds(0), nanoseconds(microseconds(10))}) {
    const WaitPlan plan = wait_plan_for(CU_CTX_SCHED_AUTO, budget);
    CHECK(plan.busy == blocking.busy);
    CHECK(plan.spin_total == blocking.spin_total);
  }
}

TEST_CASE("SPIN and YIELD never sleep; YIELD gives the CPU away from the start", "[wait_policy]") {
  const WaitPlan spin = wait_plan_for(CU_CTX_SCHED_SPIN, microseconds(0));
  CHECK(spin.busy == kForever);
  CHECK(spin.spin_total == kForever);
  CHECK_FALSE(spin.paced);
  const WaitPlan yield = wait_plan_for(CU_CTX_SCHED_YIELD, microseconds(0));
  CHECK(yield.busy == nanoseconds(0));
  CHECK(yield.spin_total == kForever);
  CHECK_FALSE(yield.paced);
}

TEST_CASE("a crowded server makes AUTO sleep after the busy spin; explicit flags still win",
          "[wait_policy]") {
  for (std::uint32_t level : {proto::kCrowded, proto::kCrowdedPastCpus}) {
    INFO("crowded " << level);
    const WaitPlan crowded = wait_plan_for(CU_CTX_SCHED_AUTO, milliseconds(20), level);
    CHECK(crowded.busy == kBusySpin);
    CHECK(crowded.spin_total == kBusySpin);
    CHECK(wait_plan_for(CU_CTX_SCHED_BLOCKING_SYNC, milliseconds(20), level).paced);
    CHECK(wait_plan_for(CU_CTX_SCHED_SPIN, milliseconds(20), level).spin_total == kForever);
    CHECK(wait_plan_for(CU_CTX_SCHED_YIELD, milliseconds(20), level).spin_total == kForever);
  }
  // Paced while the server has CPUs for its clients, and then the sleep is followed by a spin
  // long enough to see the call's usual end; past the CPUs never paced.
  const WaitPlan crowded = wait_plan_for(CU_CTX_SCHED_AUTO, milliseconds(20), proto::kCrowded);
  CHECK(crowded.paced);
  CHECK(crowded.spin_after_sleep);
  const WaitPlan past = wait_plan_for(CU_CTX_SCHED_AUTO, milliseconds(20), proto::kCrowdedPastCpus);
  CHECK_FALSE(past.paced);
  CHECK_FALSE(past.spin_after_sleep);
}

TEST_CASE("after a paced sleep a crowded server's wait spins for half the sleep", "[wait_policy]") {
  const WaitPlan crowded = wait_plan_for(CU_CTX_SCHED_AUTO, milliseconds(20), proto::kCrowded);
  const WaitPlan after = after_paced_sleep(crowded, microseconds(1460));
  CHECK(after.busy == microseconds(730));
  CHECK(after.spin_total == microseconds(730));
  // Never shorter than the busy spin; no sleep, no change.
  CHECK(after_paced_sleep(crowded, microseconds(40)).busy == kBusySpin);
  CHECK(after_paced_sleep(crowded, nanoseconds(0)).busy == kBusySpin);
  CHECK(after_paced_sleep(crowded, nanoseconds(0)).spin_total == kBusySpin);
  // Elsewhere the plan's own spin follows the sleep.
  const WaitPlan alone = wait_plan_for(CU_CTX_SCHED_AUTO, milliseconds(20));
  CHECK_FALSE(alone.spin_after_sleep);
  CHECK(after_paced_sleep(alone, microseconds(1460)).spin_total == milliseconds(20));
  const WaitPlan blocking = wait_plan_for(CU_CTX_SCHED_BLOCKING_SYNC, milliseconds(20), 1);
  CHECK(after_paced_sleep(blocking, microseconds(1460)).spin_total == kBusySpin);
}

TEST_CASE("MPSSHIM_WAIT_SPIN_US is read as microseconds; anything else is the default",
          "[wait_policy]") {
  CHECK(parse_wait_spin_us(nullptr) == kDefaultSpinTotal);
  CHECK(parse_wait_spin_us("") == kDefaultSpinTotal);
  CHECK(parse_wait_spin_us("0") == nanoseconds(0));
  CHECK(parse_wait_spin_us("500") == microseconds(500));
  CHECK(parse_wait_spin_us("3600000000") == std::chrono::seconds(3600));
  for (const char* bad :
       {"-5", "+5", " 5", "5us", "1e3", "abc", "3600000001", "99999999999999999999999"}) {
    INFO(bad);
    CHECK(parse_wait_spin_us(bad) == kDefaultSpinTotal);
  }
}

}  // namespace mpsshim::shim

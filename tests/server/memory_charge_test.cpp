// A session's memory charge on its own (session/memory_charge.hpp): what it holds and what its
// allocation is charged move together; a reservation not kept gives its bytes back; the peak
// counts kept charges only; the allocation's limit is named before the client's; bytes a closer
// of an export gives back return at the next charge.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>

#include "broker/server/session/memory_charge.hpp"

namespace mpsshim::server {
namespace {

TEST_CASE("a reservation not kept gives its bytes back; a kept one counts in the peak",
          "[server][charge]") {
  MemoryCharge charge;
  charge.set_limit(100, LimitSource::kClient);
  {
    auto held = charge.reserve(60);
    REQUIRE(held);
    CHECK(charge.used() == 60);
  }  // the driver refused: not kept
  CHECK(charge.used() == 0);
  CHECK(charge.peak() == 0);
  auto kept = charge.reserve(70);
  REQUIRE(kept);
  kept->keep();
  CHECK(charge.used() == 70);
  CHECK(charge.peak() == 70);
  const auto refused = charge.reserve(31);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == MemoryLimitHit::kClient);
  CHECK(charge.used() == 70);  // a refusal charges nothing
  charge.release(50);
  CHECK(charge.used() == 20);
  charge.release(1000);  // never below zero
  CHECK(charge.used() == 0);
  CHECK(charge.peak() == 70);
  CHECK(charge.limit_source() == LimitSource::kClient);
}

TEST_CASE("the allocation is charged with the session and its limit is named first",
          "[server][charge]") {
  auto shared = std::make_shared<AllocationAccount>(7, 100);
  MemoryCharge first, second;
  first.set_allocation(shared);
  second.set_allocation(shared);
  second.set_limit(100, LimitSource::kClient);
  auto a = first.reserve(80);
  REQUIRE(a);
  a->keep();
  CHECK(shared->used() == 80);
  // 30 more fits the second client's own limit but not the shared one.
  const auto refused = second.reserve(30);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == MemoryLimitHit::kAllocation);
  CHECK(shared->used() == 80);
  CHECK(second.used() == 0);
  // Over its own limit and within the shared one: the allocation's charge is undone too.
  second.set_limit(10, LimitSource::kOperator);
  const auto own = second.reserve(15);
  REQUIRE_FALSE(own);
  CHECK(own.error() == MemoryLimitHit::kClient);
  CHECK(shared->used() == 80);
  first.release(80);
  CHECK(shared->used() == 0);
  CHECK(first.used() == 0);
}

TEST_CASE("bytes an export's last closer gives back return at the next charge",
          "[server][charge]") {
  MemoryCharge charge;
  charge.set_limit(100, LimitSource::kServerDefault);
  auto held = charge.reserve(90);
  REQUIRE(held);
  held->keep();
  charge.returned()->bytes += 60;  // the closer's worker, through the shared counter
  CHECK(charge.used() == 90);      // not yet: only the owning worker changes the charge
  auto more = charge.reserve(50);  // 90 - 60 + 50 fits
  REQUIRE(more);
  CHECK(charge.used() == 80);
  CHECK(charge.returned()->bytes.load() == 0);
}

}  // namespace
}  // namespace mpsshim::server

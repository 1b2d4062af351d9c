#include "libshim/wait_pacer.hpp"

#include <sys/prctl.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>

using mpsshim::shim::sleep_precisely;
using mpsshim::shim::WaitPacer;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

namespace {

constexpr std::uint16_t kSynchronize = 17;

void record_n(WaitPacer& pacer, std::uint16_t op, microseconds took, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) pacer.record(op, took);
}

}  // namespace

TEST_CASE("a call is paced only after its last waits all took long", "[wait_pacer]") {
  WaitPacer pacer;
  record_n(pacer, kSynchronize, microseconds(800), WaitPacer::kHistory - 1);
  CHECK(pacer.sleep_before(kSynchronize) == nanoseconds(0));
  pacer.record(kSynchronize, microseconds(1000));
  // Three quarters of the shortest, less the wake-up's margin.
  CHECK(pacer.sleep_before(kSynchronize) == microseconds(600) - WaitPacer::kWakeMargin);

  SECTION("one quick wait among them stops the pacing until it leaves the history") {
    pacer.record(kSynchronize, microseconds(30));
    CHECK(pacer.sleep_before(kSynchronize) == nanoseconds(0));
    record_n(pacer, kSynchronize, microseconds(800), WaitPacer::kHistory - 1);
    CHECK(pacer.sleep_before(kSynchronize) == nanoseconds(0));
    pacer.record(kSynchronize, microseconds(800));
    CHECK(pacer.sleep_before(kSynchronize) == microseconds(600) - WaitPacer::kWakeMargin);
  }
  SECTION("waits just under the threshold are not paced") {
    record_n(pacer, kSynchronize, WaitPacer::kPaceFrom - microseconds(1), 1);
    CHECK(pacer.sleep_before(kSynchronize) == nanoseconds(0));
  }
  SECTION("each call has its own history; one that shares its place starts over") {
    CHECK(pacer.sleep_before(kSynchronize + 1) == nanoseconds(0));
    record_n(pacer, kSynchronize + 1, microseconds(400), WaitPacer::kHistory);
    CHECK(pacer.sleep_before(kSynchronize + 1) == microseconds(300) - WaitPacer::kWakeMargin);
    CHECK(pacer.sleep_before(kSynchronize) == microseconds(600) - WaitPacer::kWakeMargin);

    const auto same_place = static_cast<std::uint16_t>(kSynchronize + WaitPacer::kCalls);
    pacer.record(same_place, microseconds(5000));
    CHECK(pacer.sleep_before(same_place) == nanoseconds(0));
    CHECK(pacer.sleep_before(kSynchronize) == nanoseconds(0));
  }
}

TEST_CASE("a call that became quick stops being overslept within a few waits", "[wait_pacer]") {
  WaitPacer pacer;
  record_n(pacer, kSynchronize, microseconds(2000), WaitPacer::kHistory);
  // The call now takes 100 us, but a paced wait lasts at least its sleep plus a wake-up.
  const microseconds actual(100);
  int overslept = 0;
  for (int i = 0; i < 64 && pacer.sleep_before(kSynchronize) > nanoseconds(0); ++i) {
    const nanoseconds sleep = pacer.sleep_before(kSynchronize);
    pacer.record(kSynchronize, std::max<nanoseconds>(actual, sleep + microseconds(10)));
    ++overslept;
  }
  CHECK(pacer.sleep_before(kSynchronize) == nanoseconds(0));
  // 2000 us shrinks by a quarter per wait to under the threshold's reach.
  CHECK(overslept <= 8);
  CHECK(overslept >= 3);
}

TEST_CASE("a precise sleep lasts its length and leaves the thread as it found it",
          "[wait_pacer]") {
  const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  REQUIRE(slack > 0);
  errno = EAGAIN;
  const auto start = std::chrono::steady_clock::now();
  sleep_precisely(microseconds(300));
  CHECK(std::chrono::steady_clock::now() - start >= microseconds(300));
  CHECK(errno == EAGAIN);
  CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == slack);
}

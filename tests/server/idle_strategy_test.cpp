// The workers' idle strategy (broker/server/core/idle_strategy.hpp) on a clock the test moves:
// when a spell spins, yields and parks, how spells owing only watched fences that outlast
// their spin and yield make the next such spell park at once, until one ends sooner, and how a
// client trickling records makes spells owing nothing doze.
#include "broker/server/core/idle_strategy.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <vector>

namespace mpsshim::server {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;
using Clock = BackoffIdleStrategy::Clock;

Clock::time_point fake_now;
Clock::time_point read_fake_clock() {
  return fake_now;
}

struct CountingParker final : Parker {
  std::vector<nanoseconds> timeouts;
  std::vector<nanoseconds> dozes;
  bool can_doze = true;  // false: a client too old to ring only for what it waits on
  void park(nanoseconds timeout, nanoseconds) override { timeouts.push_back(timeout); }
  bool doze(nanoseconds timeout) override {
    dozes.push_back(timeout);
    return can_doze;
  }
};

BackoffIdleStrategy::Config config() {
  BackoffIdleStrategy::Config c;  // spin 20 us, yield 50, pending yield 200, naps 100
  c.park_at_once_after = 3;
  return c;
}

struct Loop {
  BackoffIdleStrategy strategy{config(), &read_fake_clock};
  CountingParker parker;
  bool crowded = false;  // what the passes are told

  // A pass that found nothing, `at` after the spell began; whether it parked.
  bool idle_at(Clock::time_point start, microseconds at, GpuWait gpu) {
    fake_now = start + at;
    const std::size_t parks = parker.timeouts.size();
    strategy.idle(0, gpu, crowded, parker);
    return parker.timeouts.size() > parks;
  }
  // One spell owing `gpu`: passes find nothing from its start to `length`, then one has work.
  // Returns whether its first pass parked.
  bool spell(GpuWait gpu, microseconds length) {
    const auto start = fake_now + microseconds(1);
    const bool first_parked = idle_at(start, microseconds(0), gpu);
    for (auto t = microseconds(5); t < length; t += microseconds(5)) idle_at(start, t, gpu);
    fake_now = start + length;
    strategy.idle(1, gpu, crowded, parker);
    return first_parked;
  }
};

TEST_CASE("a spell spins, yields, then parks: on a doorbell, or in naps with polled work owed",
          "[server][idle_strategy]") {
  Loop loop;
  const auto start = Clock::time_point{} + std::chrono::seconds(1);
  CHECK_FALSE(loop.idle_at(start, microseconds(0), GpuWait::kWatched));
  CHECK_FALSE(loop.idle_at(start, microseconds(19), GpuWait::kWatched));
  CHECK_FALSE(loop.idle_at(start, microseconds(49), GpuWait::kWatched));
  CHECK(loop.idle_at(start, microseconds(50), GpuWait::kWatched));
  CHECK(loop.parker.timeouts.back() < nanoseconds(0));  // until a doorbell

  // Polled work owed keeps the worker awake 200 us, then it naps 100 us at a time.
  fake_now = start + microseconds(60);
  loop.strategy.idle(1, GpuWait::kPolled, false, loop.parker);
  const auto polled = start + microseconds(100);
  CHECK_FALSE(loop.idle_at(polled, microseconds(0), GpuWait::kPolled));
  CHECK_FALSE(loop.idle_at(polled, microseconds(199), GpuWait::kPolled));
  CHECK(loop.idle_at(polled, microseconds(200), GpuWait::kPolled));
  CHECK(loop.parker.timeouts.back() == microseconds(100));
}

TEST_CASE("on a crowded server a spell owing polled work naps at once", "[server][idle_strategy]") {
  Loop loop;
  loop.crowded = true;
  const auto start = Clock::time_point{} + std::chrono::seconds(1);
  CHECK(loop.idle_at(start, microseconds(0), GpuWait::kPolled));
  CHECK(loop.parker.timeouts.back() == microseconds(100));
  // Watched fences still get their spin and yield: their clients spin too.
  fake_now = start + microseconds(300);
  loop.strategy.idle(1, GpuWait::kWatched, true, loop.parker);
  const auto watched = start + microseconds(400);
  CHECK_FALSE(loop.idle_at(watched, microseconds(0), GpuWait::kWatched));
  CHECK_FALSE(loop.idle_at(watched, microseconds(20), GpuWait::kWatched));
  CHECK(loop.idle_at(watched, microseconds(50), GpuWait::kWatched));

  // With crowded_pending_wait set, such a spell spins, yields until it, then naps.
  auto c = config();
  c.crowded_pending_wait = microseconds(120);
  loop.strategy = BackoffIdleStrategy(c, &read_fake_clock);
  const auto later = start + std::chrono::seconds(1);
  CHECK_FALSE(loop.idle_at(later, microseconds(0), GpuWait::kPolled));
  CHECK_FALSE(loop.idle_at(later, microseconds(119), GpuWait::kPolled));
  CHECK(loop.idle_at(later, microseconds(120), GpuWait::kPolled));
}

TEST_CASE("long watched spells in a row make the next park at once; a short one undoes it",
          "[server][idle_strategy]") {
  Loop loop;
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  for (int i = 0; i < 3; ++i) {
    CHECK_FALSE(loop.spell(GpuWait::kWatched, microseconds(600)));
    CHECK(loop.strategy.long_watched_spells() == unsigned(i + 1));
  }
  // The fourth watched spell parks on its first pass; the other kinds still spin.
  CHECK(loop.spell(GpuWait::kWatched, microseconds(600)));
  CHECK(loop.strategy.long_watched_spells() == 3);  // capped
  CHECK_FALSE(loop.spell(GpuWait::kPolled, microseconds(600)));
  CHECK_FALSE(loop.spell(GpuWait::kNone, microseconds(600)));
  CHECK(loop.strategy.long_watched_spells() == 3);  // the other kinds leave the count alone
  CHECK(loop.spell(GpuWait::kWatched, microseconds(600)));

  // A spell that parked at once but whose work came back within the spin and yield (10 us)
  // brings spinning back for the next three.
  CHECK(loop.spell(GpuWait::kWatched, microseconds(10)));
  CHECK(loop.strategy.long_watched_spells() == 0);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(loop.spell(GpuWait::kWatched, microseconds(600)));
  CHECK(loop.spell(GpuWait::kWatched, microseconds(600)));

  // Work that comes back after the spin but within the yield also counts as short.
  CHECK(loop.spell(GpuWait::kWatched, microseconds(49)));
  CHECK_FALSE(loop.spell(GpuWait::kWatched, microseconds(49)));
}

TEST_CASE("spells owing polled work always spin and yield first", "[server][idle_strategy]") {
  Loop loop;
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(loop.spell(GpuWait::kPolled, microseconds(600)));
  CHECK(loop.strategy.long_watched_spells() == 0);
}

TEST_CASE("a spell whose client falls asleep spins again, and the count starts over",
          "[server][idle_strategy]") {
  Loop loop;
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  for (int i = 0; i < 3; ++i) loop.spell(GpuWait::kWatched, microseconds(600));
  const auto start = fake_now + microseconds(1);
  CHECK(loop.idle_at(start, microseconds(0), GpuWait::kWatched));
  // A client went to sleep on its slot meanwhile: its answer needs polls, sooner than a nap.
  CHECK_FALSE(loop.idle_at(start, microseconds(5), GpuWait::kPolled));
  // It watches nothing now: the count starts over, and the next watched spells spin.
  CHECK(loop.strategy.long_watched_spells() == 0);
  fake_now = start + microseconds(600);
  loop.strategy.idle(1, GpuWait::kPolled, false, loop.parker);
  CHECK(loop.strategy.long_watched_spells() == 0);
  CHECK_FALSE(loop.spell(GpuWait::kWatched, microseconds(600)));
}

TEST_CASE("park_at_once_after 0 always spins first", "[server][idle_strategy]") {
  auto c = config();
  c.park_at_once_after = 0;
  Loop loop;
  loop.strategy = BackoffIdleStrategy(c, &read_fake_clock);
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(loop.spell(GpuWait::kWatched, microseconds(600)));
}

TEST_CASE("spells owing nothing doze once the client has been trickling; a quick record undoes it",
          "[server][idle_strategy]") {
  Loop loop;  // doze after 5 us once 4 such spells in a row lasted that long; dozes of 15 us
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  // A client sending a record every 15 us: the first four spells spin through their gaps.
  for (int i = 0; i < 4; ++i) {
    loop.spell(GpuWait::kNone, microseconds(15));
    CHECK(loop.strategy.trickling_spells() == unsigned(i + 1));
  }
  CHECK(loop.parker.dozes.empty());
  // The fifth spins until 5 us, then dozes, once.
  const auto start = fake_now + microseconds(1);
  CHECK_FALSE(loop.idle_at(start, microseconds(0), GpuWait::kNone));
  CHECK_FALSE(loop.idle_at(start, microseconds(4), GpuWait::kNone));
  CHECK(loop.parker.dozes.empty());
  CHECK_FALSE(loop.idle_at(start, microseconds(5), GpuWait::kNone));
  REQUIRE(loop.parker.dozes.size() == 1);
  CHECK(loop.parker.dozes.back() == microseconds(15));
  // A doze that found nothing: the spell goes on as before, parking once past its yield.
  CHECK_FALSE(loop.idle_at(start, microseconds(21), GpuWait::kNone));
  CHECK(loop.idle_at(start, microseconds(50), GpuWait::kNone));
  CHECK(loop.parker.dozes.size() == 1);
  fake_now = start + microseconds(300);
  loop.strategy.idle(1, GpuWait::kNone, false, loop.parker);
  CHECK(loop.strategy.trickling_spells() == 4);  // capped

  // Spells owing GPU work never doze and leave the count alone.
  loop.spell(GpuWait::kWatched, microseconds(600));
  loop.spell(GpuWait::kPolled, microseconds(600));
  CHECK(loop.parker.dozes.size() == 1);
  CHECK(loop.strategy.trickling_spells() == 4);

  // A record that comes back within 5 us (a launch's synchronize) brings the spin back.
  loop.spell(GpuWait::kNone, microseconds(3));
  CHECK(loop.strategy.trickling_spells() == 0);
  for (int i = 0; i < 4; ++i) loop.spell(GpuWait::kNone, microseconds(15));
  CHECK(loop.parker.dozes.size() == 1);
  loop.spell(GpuWait::kNone, microseconds(15));
  CHECK(loop.parker.dozes.size() == 2);
}

TEST_CASE("a worker that cannot doze spins, yields and parks as before",
          "[server][idle_strategy]") {
  Loop loop;
  loop.parker.can_doze = false;
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  for (int i = 0; i < 4; ++i) loop.spell(GpuWait::kNone, microseconds(15));
  const auto start = fake_now + microseconds(1);
  CHECK_FALSE(loop.idle_at(start, microseconds(0), GpuWait::kNone));
  CHECK_FALSE(loop.idle_at(start, microseconds(5), GpuWait::kNone));
  CHECK(loop.parker.dozes.size() == 1);
  CHECK_FALSE(loop.idle_at(start, microseconds(10), GpuWait::kNone));
  CHECK(loop.parker.dozes.size() == 1);  // tried once a spell
  REQUIRE(loop.idle_at(start, microseconds(50), GpuWait::kNone));
  CHECK(loop.parker.timeouts.back() < nanoseconds(0));
}

TEST_CASE("doze_after_spells 0 never dozes", "[server][idle_strategy]") {
  auto c = config();
  c.doze_after_spells = 0;
  Loop loop;
  loop.strategy = BackoffIdleStrategy(c, &read_fake_clock);
  fake_now = Clock::time_point{} + std::chrono::seconds(1);
  for (int i = 0; i < 10; ++i) loop.spell(GpuWait::kNone, microseconds(600));
  CHECK(loop.parker.dozes.empty());
}

}  // namespace
}  // namespace mpsshim::server

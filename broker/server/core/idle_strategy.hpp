// What the server loop does when a pass found nothing to do (Aeron's idle strategies): spin
// briefly for the lowest hand-off latency, then yield the CPU, then park in the kernel until a
// client rings its doorbell. The GPU cannot ring anything: while completions are owed that only
// a poll learns of, the strategy parks for short timeouts and keeps polling. A completion whose
// waiting client watches its fence (ResponseSlot::watch) needs no poll: the client rings when
// the fence lands, and the worker sleeps until then.
//
// Spinning pays only when work comes back within the spin. A client that synchronizes behind a
// long queue of kernels sends nothing until its wait ends: every spell the worker then spends
// spinning and yielding is CPU for nothing (70 us per synchronize of 64 small kernels: about a
// microsecond per kernel). So the strategy remembers how its last spells begun with only watched
// fences owed ended: after `park_at_once_after` of them in a row outlasted their spin and yield,
// the next such spell parks at once, and the client's doorbell wakes it. One that ends sooner
// brings the spin back, and so does a client that falls asleep on its slot (it then watches
// nothing: a crowded server's clients do after 60 us). Spells owing polled work always spin and
// yield first: the yield is how soon their completions are found, except on a crowded server
// (more clients than it lets spin): its clients sleep rather than spin, the spin and the yield
// took CPUs those clients need and found their completions no sooner than the naps do, so
// such spells nap at once.
//
// A client that launches one kernel at a time with host work between them (PyTorch's eager
// mode: a record every 10-20 us) keeps a spinning worker busy for nothing between its records.
// Once such a client has been trickling (the last spells owing nothing outlasted `doze_after`),
// a spell owing nothing dozes after `doze_after`: one nap of at most `doze` during which its
// one-way records collect in the ring unannounced (proto::kConsumerDozing) and go out together
// when it ends; a record its client then waits for rings the doorbell and ends the doze at once.
// The GPU meanwhile runs what was issued before; what the doze holds back is at most `doze` of
// the client's launches, so the doze is short.

#pragma once

#include <chrono>
#include <cstddef>

namespace mpsshim::server {

// What the loop owes for GPU work when a pass ends.
enum class GpuWait {
  kNone,     // nothing
  kWatched,  // only answers whose fences the waiting clients watch: they ring when one lands
  kPolled,   // work that only a poll learns of has completed
};

class Parker {
 public:
  virtual ~Parker() = default;
  // Sleeps until something arrives for the loop, at most `timeout` (negative: no limit but
  // what the parker finds it owes: its watches' fault checks, or `poll_nap` when a client
  // that watched a fence went to sleep meanwhile).
  virtual void park(std::chrono::nanoseconds timeout, std::chrono::nanoseconds poll_nap) = 0;
  // Naps at most `timeout` while one-way records collect (proto::kConsumerDozing): woken only
  // by a record whose client waits, mail or a socket. False, at once, when it cannot: a client
  // too old to ring only for the records it waits on.
  virtual bool doze(std::chrono::nanoseconds timeout) = 0;
};

class IdleStrategy {
 public:
  virtual ~IdleStrategy() = default;
  // Called after every pass of the loop with the amount of work that pass did; `crowded`:
  // the server has more clients than it lets spin (Server::crowded).
  virtual void idle(std::size_t work, GpuWait gpu, bool crowded, Parker& parker) = 0;
};

class BackoffIdleStrategy final : public IdleStrategy {
 public:
  struct Config {
    std::chrono::nanoseconds spin = std::chrono::microseconds(20);
    // Short: a worker whose answers are watched parks soon after its pass (fence_watch.hpp), and
    // a record then costs its client a doorbell (docs/benchmarks.md, "Measurements behind the
    // defaults").
    std::chrono::nanoseconds yield = std::chrono::microseconds(50);
    // While GPU work is owed that only a poll learns of: yield longer, then park in short naps
    // between polls. 200 us, not 1 ms: it cost 32 crowded clients' workers 4.75-4.88 us per
    // kernel against 6.31-6.62, when crowded servers still yielded too. Uncrowded servers keep
    // it (draining sessions, the priority classes' linger): without it the high-priority p99
    // beside 4 batch clients was 1.32 and 1.20x alone against 1.16 and 1.16 (docs/benchmarks.md,
    // "Measurements behind the defaults").
    std::chrono::nanoseconds pending_yield = std::chrono::microseconds(200);
    std::chrono::nanoseconds pending_nap = std::chrono::microseconds(100);
    // On a crowded server, such a spell spins (at most `spin`) and yields only until this,
    // then naps (docs/benchmarks.md, "Measurements behind the defaults").
    std::chrono::nanoseconds crowded_pending_wait = std::chrono::microseconds(0);
    // After this many spells in a row begun with only watched fences owed outlasted their spin
    // and yield, the next such spell parks at once. 0: never.
    unsigned park_at_once_after = 8;
    // A spell owing nothing dozes once it lasted `doze_after`, if the last `doze_after_spells`
    // spells owing nothing in a row lasted that long too; the doze lasts at most `doze`.
    // 0 spells: never dozes. 15 us, not 50: 50 us dozes held back so many launches that the GPU
    // waited for them (a lone ResNet-50 client 3.9-4.6 ms per iteration against 2.1-3.5 without
    // dozes); 15 us dozes ran it at 2.6-4.0 ms and 8 of them at 3.6-4.6 against 3.8-4.8, with
    // 0.3-0.5 fewer cores busy per client (docs/benchmarks.md, "Measurements behind the
    // defaults").
    std::chrono::nanoseconds doze_after = std::chrono::microseconds(5);
    std::chrono::nanoseconds doze = std::chrono::microseconds(15);
    unsigned doze_after_spells = 4;
  };
  using Clock = std::chrono::steady_clock;

  BackoffIdleStrategy() = default;
  // `now`: the clock, for tests.
  explicit BackoffIdleStrategy(Config config, Clock::time_point (*now)() = &Clock::now)
      : config_(config), now_(now) {}

  void idle(std::size_t work, GpuWait gpu, bool crowded, Parker& parker) override;

  // How many spells begun with only watched fences owed in a row outlasted their spin and
  // yield (capped at park_at_once_after): for tests.
  unsigned long_watched_spells() const { return long_watched_spells_; }
  // How many spells owing nothing in a row lasted `doze_after` (capped at doze_after_spells).
  unsigned trickling_spells() const { return trickling_spells_; }

 private:
  void end_spell(Clock::time_point now);

  Config config_;
  Clock::time_point (*now_)() = &Clock::now;
  bool idle_ = false;  // in a spell: the last pass found nothing
  Clock::time_point idle_since_{};
  bool spell_watched_ = false;  // the spell began with only watched fences owed
  bool park_at_once_ = false;   // this spell skips its spin and yield
  unsigned long_watched_spells_ = 0;
  bool spell_owed_nothing_ = false;  // the spell began with nothing owed
  bool dozed_ = false;               // this spell dozed (once per spell)
  unsigned trickling_spells_ = 0;
};

}  // namespace mpsshim::server

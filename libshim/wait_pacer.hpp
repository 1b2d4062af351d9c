// Paced waits: a thread whose last waits for the same call all took long sleeps through most of
// the next one before it spins for its end, as Linux's block layer polls a fast device (hybrid
// polling). The real driver spins through a whole synchronize, and so did the shim: 8 clients of
// ~10 us kernels synchronizing every 64 launches each wait ~0.8 ms per synchronize, and their
// spinning was most of the machine's CPU (docs/benchmarks.md, "Host CPU").
//
// The sleep is taken from the shortest of the call's last kHistory waits on this thread, so a
// call that was quick even once among them is not paced; a wait that turns out shorter than the
// sleep is recorded as the sleep's length and shrinks the next one by a quarter, so a call that
// became quicker stops being overslept within a few waits.
//
// One pacer per thread (thread_local in Session::wait_slot), touched by that thread alone.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace mpsshim::shim {

class WaitPacer {
 public:
  // Waits remembered per call.
  static constexpr std::size_t kHistory = 8;
  // Calls remembered at once (direct-mapped by op: a thread alternates among a few).
  static constexpr std::size_t kCalls = 8;
  // Only a call whose last kHistory waits each took at least this long is paced.
  static constexpr std::chrono::microseconds kPaceFrom = std::chrono::microseconds(200);
  // What a sleep may overrun by: the wake-up (a few us on bare metal, more in a VM whose idle
  // vCPU halted) with a timer slack of 1 us.
  static constexpr std::chrono::microseconds kWakeMargin = std::chrono::microseconds(40);

  // How long a wait for `op` should sleep before it spins; 0: spin from the start.
  std::chrono::nanoseconds sleep_before(std::uint16_t op) const;
  // The wait for `op` that just ended took `took`, sleep included.
  void record(std::uint16_t op, std::chrono::nanoseconds took);

 private:
  struct Call {
    std::uint16_t op = 0;
    std::uint8_t count = 0;  // waits recorded, up to kHistory
    std::uint8_t next = 0;   // where the next one goes
    std::array<std::uint32_t, kHistory> took_us{};
  };
  std::array<Call, kCalls> calls_{};
};

// Sleeps `duration` with a timer slack of 1 us (the thread's own slack is put back after), so
// the sleep ends within kWakeMargin of it.
void sleep_precisely(std::chrono::nanoseconds duration);

}  // namespace mpsshim::shim

// How late the kernel may end a worker thread's timed sleeps.
//
// Linux lets a timed sleep of a normal (SCHED_OTHER) thread end up to its timer slack late, 50 us
// by default, so that wake-ups coalesce. A worker's timed sleeps are short by design: the 100 us
// naps between polls of GPU work no client watches (a crowded server's, whose clients sleep) and
// the 15 us dozes between a trickling client's records (idle_strategy.hpp). With the default slack
// a nap lasts 100-150 us and a doze 15-65 us. The workers keep it: with 1 us of slack, 8 ResNet-50
// clients ran 1,593-1,603 iterations/s at 7.97-7.99 ms of the machine's CPU each, against
// 1,902-2,026 at 6.03-6.20 with the default, and the mixed workload's large kernels gained nothing
// (899-916/s against 912) (docs/benchmarks.md, "Measurements behind the defaults").
// MPSSHIM_SERVER_TIMER_SLACK sets it, for measuring.
#pragma once

#include <chrono>
#include <optional>

namespace mpsshim::server {

// MPSSHIM_SERVER_TIMER_SLACK: nanoseconds (1 to 1,000,000,000), or unset, empty or "inherit" to
// leave each worker the slack the server started with (nullopt). A malformed value is logged
// and inherits.
std::optional<std::chrono::nanoseconds> worker_timer_slack(const char* text);

// Sets the calling thread's timer slack (prctl PR_SET_TIMERSLACK; nullopt leaves it) and returns
// the slack the thread has now, as the kernel reports it (a refusal is logged).
std::chrono::nanoseconds set_thread_timer_slack(std::optional<std::chrono::nanoseconds> slack);

}  // namespace mpsshim::server

// Priorities that protect latency: while a normal-priority client (CUDA_MPS_CLIENT_PRIORITY 0)
// has work pending or running on the GPU, the workers hold back the submissions of
// below-normal clients (CUDA_MPS_CLIENT_PRIORITY 1).
//
// Once a launch is in the driver it runs: the GPU has hardware queues, and work queued there
// ahead of a normal client's kernel can only be outranked by stream priority, block by block.
// So the hold happens before the driver call, at the one safe point of a session, the start of
// its drain pass (no launch batch is waiting then), and what it limits is how far ahead a
// below-normal client may run: while normal work is in flight, a below-normal session drains
// only once the work of its previous pass has finished on the GPU (a fence per stream it
// queued work on), and then at most `run_ahead` records. So at most one short pass of each
// below-normal client is queued on the GPU beside the normal client's work. A hold never lasts
// longer than `max_hold`: a below-normal client whose earlier work waits for something that
// never comes (a host function, another process) is not stopped for good.
//
// A normal session counts as busy from the pass that finds a record in its ring until its ring
// is empty, nothing is owed to it and its fences completed, plus `linger`: a client that
// launches and synchronizes in a loop is idle for a few microseconds between two kernels, and
// a hold released then would let the below-normal clients queue a pass just before the next.
//
// Also, while this is on, a normal client's streams rank one step above the priority they ask
// (within the device's range), so the GPU's block scheduler prefers them to a below-normal
// client's streams, which rank one step below (CUDA_MPS_CLIENT_PRIORITY's MPS meaning).
//
// Ownership (docs/architecture.md): the board's counters are the only shared state: atomics,
// written by the worker that owns a session (and the coordinator at admission), read by every
// worker at the start of a pass; no lock on the launch path. A session's PriorityState belongs
// to its worker.
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "broker/server/driver/host_fences.hpp"
#include "broker/server/scheduling/sm_reserve_option.hpp"

namespace mpsshim::server {

class Session;

struct PrioritySettings {
  bool enabled = true;  // mpsshim-server --priority-scheduling on|off
  // The longest a below-normal session is held at once (--priority-max-hold-us).
  std::chrono::microseconds max_hold{2000};
  // Records a held-back below-normal session may drain in one pass while normal work is in
  // flight (--priority-run-ahead).
  std::size_t run_ahead = 4;
  // How long a normal session stays busy after it was last seen with work.
  std::chrono::microseconds linger{200};
  // How often a worker asks the driver whether a session's event fences completed
  // (priority_poll, priority_permit; --priority-fence-poll-us, 0: on every pass): every
  // cuEventQuery takes the lock inside the driver that a normal client's launch waits for, and a
  // held session's worker spins through its passes; asked on every pass, the queries of four
  // held batch clients' workers delayed the latency client's launches. Only for event fences
  // (--host-fences off, or a crowded server: priority_end_pass): a host-fence word is read on
  // every pass, which costs no driver call.
  std::chrono::microseconds fence_poll{50};
  // SMs below-normal clients leave to normal ones while one is connected (priority_reserve.hpp;
  // --priority-reserve-sms); only while `enabled`.
  SmReserveSpec reserve = kDefaultSmReserve;
};

// Shared by every worker of the server.
class PriorityBoard {
 public:
  // Admission (coordinator) and the session's free (its worker).
  void joined(bool below_normal);
  void left(bool below_normal);

  // Normal sessions with work pending or running.
  int busy_normal() const { return busy_normal_.load(std::memory_order_acquire); }
  int normal_sessions() const { return normal_.load(std::memory_order_relaxed); }
  // Counts every normal session's arrival and departure: a below-normal session that gave up
  // moving (follow_priority_reserve) tries again once this changed.
  std::uint64_t normal_changes() const { return normal_changes_.load(std::memory_order_relaxed); }
  int below_normal_sessions() const { return below_normal_.load(std::memory_order_relaxed); }

  void mark_busy() { busy_normal_.fetch_add(1, std::memory_order_acq_rel); }
  void mark_idle() { busy_normal_.fetch_sub(1, std::memory_order_acq_rel); }

 private:
  std::atomic<int> busy_normal_{0};
  std::atomic<int> normal_{0};
  std::atomic<int> below_normal_{0};
  std::atomic<std::uint64_t> normal_changes_{0};
};

// Per session; owned by its worker.
struct PriorityState {
  bool below_normal = false;
  bool counted_busy = false;  // normal: counted in PriorityBoard::busy_normal
  std::chrono::steady_clock::time_point idle_since{};  // normal: seen idle first (or epoch)
  std::chrono::steady_clock::time_point held_since{};  // below normal: its hold began (or epoch)
  std::vector<CUstream> touched;                       // streams this pass queued work on
  // After the work of its last passes, not yet completed: a host-fence word the GPU writes
  // (Session::fences.words) where the session uses them, else a pool event (`event`).
  struct Fence {
    HostFence word;
    CUevent event = nullptr;
  };
  std::vector<Fence> fences;
  std::chrono::steady_clock::time_point fences_asked{};  // events: the driver last asked (or epoch)
  std::uint64_t fenced = 0;                              // fences recorded after its passes
  std::uint64_t holds = 0;                               // times it was held back (below normal)
  std::uint64_t held_us = 0;                             // time held back, summed (below normal)
  std::uint64_t released_by_bound = 0;  // holds that ended at max_hold, not at a fence
};

// The start of a session's drain pass: whether it may drain now, and how many records at most
// (0: the server's usual share). Below-normal sessions only; normal ones always drain.
struct DrainPermit {
  bool drain = true;
  std::size_t limit = 0;
};
DrainPermit priority_permit(Session& session, PriorityBoard& board,
                            const PrioritySettings& settings,
                            std::chrono::steady_clock::time_point now);
// A normal session found a record in its ring: it counts as busy from now.
void priority_saw_work(Session& session, PriorityBoard& board);
// Before queueing work on `stream` in a pass (the hook is in open_busy_span).
void priority_note_stream(Session& session, CUstream stream);
// A completion now waits for the work queued on `stream` (Session::fence_into): for a normal
// session that work needs no fence of its own, since the session is busy until the completion
// fires (pending_gpu_work). Saves a latency client that synchronizes after each launch a
// cuEventRecord and its queries per round trip.
void priority_note_covered(Session& session, CUstream stream);
// The end of a drain pass: a fence on every stream the pass queued work on, if anyone may
// wait for it (a below-normal session beside normal ones, or the other way round).
void priority_end_pass(Session& session, const PriorityBoard& board);
// The worker's poll: drops completed fences; a normal session with nothing left in flight
// stops counting as busy after the linger. Returns the fences that completed.
std::size_t priority_poll(Session& session, PriorityBoard& board, const PrioritySettings& settings,
                          std::chrono::steady_clock::time_point now);
// The session is freed: it stops counting, its fences go back to its pool.
void priority_leave(Session& session, PriorityBoard& board);

}  // namespace mpsshim::server

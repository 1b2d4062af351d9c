// The plain parts of a Session (session.hpp), one per concern, each with the files that keep
// it and what holds of it. Every part is owned by the session's worker: only that thread reads
// or writes it, after admission filled it in before the session was placed. The part with
// behaviour of its own, the memory charge, is memory_charge.hpp.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "broker/server/driver/host_fences.hpp"
#include "broker/server/scheduling/green_context.hpp"
#include "broker/server/scheduling/priority_reserve.hpp"
#include "broker/server/session/ipc_registry.hpp"
#include "proto/ops_vmm.hpp"

namespace mpsshim::server {

enum class SessionState { kActive, kDraining };

// How the session ends (core/session_end.cpp, session/retire.cpp): active until a hang-up, a
// malformed record, terminate_client or shutdown makes it draining (its queued GPU work runs to
// its end, then everything it owned is freed). `end_requested` is set by anything that finds
// mid-record that the session must end (socket hang-up, a malformed socket message); the worker
// ends it after the record, storing `end_notify` as the fault.
struct Lifecycle {
  SessionState state = SessionState::kActive;
  std::string end_reason;
  std::string end_requested;
  CUresult end_notify = CUDA_SUCCESS;
  std::chrono::steady_clock::time_point drain_started{};
  bool drain_warned = false;
};

// A move into or out of the SMs reserved for normal-priority clients (priority_reserve.hpp)
// that failed is tried again at `at`, with a doubling delay, a few times; after the last, not
// before the board's normal_changes() moved on from `given_up_at` (follow_priority_reserve).
struct ReserveRetry {
  std::chrono::steady_clock::time_point at{};
  unsigned failures = 0;
  bool given_up = false;
  std::uint64_t given_up_at = 0;
};

// The SMs the session runs on: the share it was granted, in percent (its green context rounds
// up); MPSSHIM_SM_GRANULARITY=2 (kHelloIgnoreSmCoscheduling); its allocation's slot of the
// device, kept across live changes (green_context.hpp); the SMs reserved for normal-priority
// clients that a below-normal client leaves while one is connected (priority_reserve.hpp: set
// at admission for below-normal clients without a placement when the server reserves any, else
// off), whether its green context is kept out of them now, and the retries of a failed move.
struct SmShare {
  int percentage = 100;
  bool ignore_coscheduling = false;
  SmPlacement placement;
  SmReserve reserve;
  bool kept_out_of_reserve = false;
  ReserveRetry reserve_retry;
};

// Interprocess memory (ipc_memory.cpp, docs/ipc.md): what the session exported, by allocation
// base, with the handle it was given (exporting again gives the same one); what it opened, by
// base, with how many opens are not closed yet (an open of a handle it has open counts one
// more, as in the driver). An export leaves `exports` when its exporter lets go of the memory;
// an import leaves `imports` when its opens reach 0.
struct IpcHoldings {
  struct Export {
    std::shared_ptr<IpcMemory> memory;
    proto::IpcHandle handle;
  };
  struct Import {
    std::shared_ptr<IpcMemory> memory;
    std::uint32_t opens = 0;
  };
  std::map<std::uint64_t, Export> exports;
  std::map<std::uint64_t, Import> imports;
  std::uint8_t refusals_logged = 0;  // bit per IpcRefusalKind logged at warn (ops/ipc.cpp)
};

// How the session learns that GPU work finished (host_fences.hpp, completions.cpp): the words
// the GPU writes, used while `use_words` (ServerSettings::host_fences, and off for the session
// after a failed fence); and what the worker sets from the server's state at every pass.
struct FencePolicy {
  HostFences words;
  bool use_words = false;
  // A synchronize gets a host fence when at most this many operations are queued on its stream:
  // no limit unless the server is crowded (Worker::drain_ring sets it at every pass from
  // ServerSettings::crowded_fence_max_queued).
  std::uint64_t max_queued = UINT64_MAX;
  // Whether the server was crowded at this pass (set beside max_queued): then the priority
  // gate's fences are events, as cheap to record as a host fence is costly (priority_gate.cpp).
  bool crowded = false;
  // ServerSettings::event_poll, copied at admission: a completion's event is asked at most this
  // often.
  std::chrono::microseconds event_poll{0};
};

// GPU busy time (busy_time.hpp), measured only when `on` (ServerSettings::busy_time): spans
// whose end is not recorded yet (end == nullptr), one per stream at most; spans waiting for
// their end to complete; timing events to reuse. Every event here is the session's to destroy.
struct BusySpans {
  struct Span {
    CUstream stream;
    CUevent begin;
    CUevent end;
  };
  bool on = false;
  std::vector<Span> open;
  std::vector<Span> closed;
  std::vector<CUevent> timing_pool;
};

// Live SM quota changes (sm_quota_change.hpp). `generation` is bumped at each; the green
// contexts the client had before are kept until the session ends (graphs instantiated then, and
// events recorded then, still name them); events of an earlier green context that are still in
// use are destroyed instead of pooled when they come back; driver events an event node of a
// graph still names after the client's event moved on to a fresh one are destroyed at session
// end, after the graphs; a change waits in `pending_percentage` for the client's captures to
// end (0: none).
struct QuotaChanges {
  std::uint32_t generation = 0;
  std::vector<GreenContext> earlier_greens;
  std::vector<CUevent> stale_events;
  std::vector<CUevent> graph_events;
  int pending_percentage = 0;
};

// Diagnostics (answer_stamps.hpp), CLOCK_MONOTONIC ns: when the record being run left the ring
// (set for every record), and when the last kernel launch did and went to the driver (set only
// with the stamps on).
struct RecordStamps {
  std::uint64_t record_taken_ns = 0;
  std::uint64_t launch_taken_ns = 0;
  std::uint64_t launch_issued_ns = 0;
};

// Refusals already logged at warn, so that a client that loops on one is no flood: a bit per
// ClientLimit (limit_check.hpp), and whether it named another's handle or memory
// (note_not_owned).
struct RefusalsLogged {
  std::uint32_t limits = 0;
  bool not_owned = false;
};

// Whether the session is suspended (suspension.hpp), by the operator or by a memory policy
// (`by_policy`): while `on`, its worker reads nothing from its ring and its device memory is
// parked on the host. For `ps` and the metrics: the bytes parked, since when, and the time of
// its earlier suspensions.
struct Suspension {
  bool on = false;
  bool by_policy = false;
  std::uint64_t parked_bytes = 0;
  std::chrono::steady_clock::time_point since{};
  std::chrono::nanoseconds earlier{0};
  std::uint32_t count = 0;

  // Time suspended in all, the current suspension included.
  std::chrono::nanoseconds total(std::chrono::steady_clock::time_point now) const {
    return earlier + (on ? now - since : std::chrono::nanoseconds{0});
  }
};

// A cuMemAlloc, cuMemAllocPitch or cuMemCreate that did not fit on the GPU and waits for a
// memory policy (scheduling/memory_arbiter.hpp): its answer stays owed on `slot` until the
// coordinator has the worker try it again (retry_waiting_allocation, ops/ops.hpp). One per
// session at a time: a second allocation that does not fit meanwhile fails at once.
struct MemoryWait {
  enum class Call { kMemAlloc, kMemAllocPitch, kMemCreate, kMemAllocAsync };
  bool on = false;
  Call call = Call::kMemAlloc;
  std::uint32_t slot = 0;
  std::uint64_t bytes = 0;     // cuMemAllocPitch: the rows' padded bytes
  std::uint64_t ctx = 0;       // cuMemAlloc(Pitch): the client's context id the allocation names
  std::uint64_t pitch = 0;     // cuMemAllocPitch: the pitch its answer carries
  std::uint64_t pool = 0;      // cuMemAllocAsync: the client's pool id it allocates from
  proto::VmmProp prop{};       // cuMemCreate: the properties asked for
  std::uint64_t taken_ns = 0;  // when its record left the ring (answer_stamps.hpp)
  std::chrono::steady_clock::time_point since{};

  // The driver call that waits, for the log.
  const char* what() const {
    switch (call) {
      case Call::kMemAllocPitch:
        return "cuMemAllocPitch";
      case Call::kMemCreate:
        return "cuMemCreate";
      case Call::kMemAllocAsync:
        return "cuMemAllocAsync";
      case Call::kMemAlloc:
        break;
    }
    return "cuMemAlloc";
  }
};

}  // namespace mpsshim::server

// SMs reserved for normal-priority clients (mpsshim-server --priority-reserve-sms N|P%, with
// --priority-scheduling on): while at least one normal-priority client (CUDA_MPS_CLIENT_PRIORITY
// 0 or unset) is connected, every below-normal client runs in a green context without them,
// so a normal client's kernel finds SMs no below-normal kernel can occupy. Holding back
// submissions (priority_gate.hpp) cannot give it that: a below-normal kernel already running on
// every SM cannot be preempted (66x the p99 alone on an H100, docs/benchmarks.md).
//
// The reserve is the device's last `groups` groups of the split in the hardware's steps (the
// split static partitions are cut from). A below-normal client whose share reaches into them
// runs, while held back, on all the other SMs: the split's other groups and the SMs it leaves
// over; one whose share lies before them (a small CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: a split
// takes the device's first SMs) is not moved. Normal clients keep the whole device, or take a
// smaller share from the device's end, where the reserve lies (green_context.hpp). Clients with
// a placement of their own (a static partition, a Kubernetes allocation's slot) keep it.
//
// The move happens on the session's worker at the start of a pass (its safe point: nothing
// waits in its launch batch) and never while a stream capture is open; it is the live SM quota
// change's (sm_quota_change.hpp): each stream continues in the new green context after its
// last work, so the order within each stream is kept. When the last normal client's session
// is freed, the below-normal clients get their whole share back the same way. A session keeps
// the green contexts it had, so moving back and forth reuses them.
#pragma once

#include <cuda.h>

#include <chrono>

#include <tl/expected.hpp>

#include "broker/server/driver/driver_table.hpp"
#include "broker/server/driver/gpu.hpp"
#include "broker/server/scheduling/green_context.hpp"
#include "broker/server/scheduling/green_context_pool.hpp"
#include "broker/server/scheduling/sm_reserve_option.hpp"

namespace mpsshim::server {

class Session;
class PriorityBoard;

struct SmReserve {
  unsigned groups = 0;        // the device split's last `groups` groups; 0: off
  unsigned granularity = 0;   // SMs per group
  unsigned split_groups = 0;  // groups the device splits into
  unsigned sms() const { return groups * granularity; }
  bool on() const { return groups != 0; }
};

// The reserve `spec` asks of a device of `sm_count` SMs splitting into `split_groups` groups of
// `granularity`: rounded up to whole groups, at least one, and at least one group left over.
SmReserve plan_sm_reserve(const SmReserveSpec& spec, unsigned sm_count, unsigned granularity,
                          unsigned split_groups);

// Whether a client of `planned` quota, not placed, would run on reserved SMs: its share is the
// whole device or more SMs than the groups before the reserve.
bool reaches_reserve(const PlannedQuota& planned, const SmReserve& reserve);

// Every SM of the device but the reserved ones: the split's groups before them and the SMs the
// split leaves over (held_back_sms is left to the caller).
tl::expected<GreenContext, CUresult> make_green_outside_reserve(const DriverTable& cu,
                                                                CUdevice device,
                                                                const CUdevResource& device_sms,
                                                                const SmReserve& reserve);

// A client's green context for `planned` (of `percentage`): outside the reserve when asked and
// its share reaches into it (and it has no placement of its own), else as make_green_context
// gives it; marked with its shape (GreenContext::percentage, outside_reserve, held_back_sms).
tl::expected<GreenContext, CUresult> make_client_green_context(
    GreenContextPool& pool, const Gpu& gpu, int percentage, const PlannedQuota& planned,
    const SmPlacement& placement, const SmReserve& reserve, bool outside_reserve);

// On the session's worker, before its drain pass: a below-normal session follows the board
// (out of the reserve while a normal session is connected, back when none is). Nothing for
// other sessions, nor while a capture is open (the next pass tries again). A move that fails
// (building the green context) is logged and tried again after kReserveRetryFirst, the delay
// doubling, at most kReserveMoveTries times in all; then the session stays where it is until
// a normal client connects or leaves (PriorityBoard::normal_changes).
inline constexpr std::chrono::milliseconds kReserveRetryFirst{100};
inline constexpr unsigned kReserveMoveTries = 5;
void follow_priority_reserve(Session& session, const PriorityBoard& board,
                             std::chrono::steady_clock::time_point now);

}  // namespace mpsshim::server

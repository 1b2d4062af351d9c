// A client's green context: the SMs of its quota, split off the device's SM resource.
#pragma once

#include <cuda.h>

#include <mutex>
#include <vector>

#include <tl/expected.hpp>

#include <cstdint>

#include "broker/server/driver/driver_table.hpp"
#include "broker/server/scheduling/quota.hpp"
#include "proto/device_snapshot.hpp"

namespace mpsshim::server {

// What decides which SMs make_green_context gives: two green contexts of equal shape are
// interchangeable (green_context_pool.hpp). The device's SM resource, the other input, is fixed
// for the server's life. Only what the chosen branch of make_green_context reads is set, so
// that inputs giving the same SMs compare equal (a partition is its groups, not its id).
struct GreenShape {
  enum class Kind : std::uint8_t {
    kNone,         // not made by make_green_context: never pooled
    kWholeDevice,  // every SM, no split
    kSplit,        // the first `target` SMs of one split
    kPlaced,       // a run of `granularity`-sized groups: a slot of `slots`, or a partition's
    // every SM but the ones reserved for normal-priority clients (priority_reserve.hpp), of a
    // split in `granularity` steps into `groups` groups
    kOutsideReserve,
  };
  Kind kind = Kind::kNone;
  unsigned split_flags = 0;
  unsigned target = 0;
  unsigned granularity = 0;
  unsigned slot = 0;
  unsigned slots = 0;
  unsigned first_group = 0;
  unsigned groups = 0;
  bool at_device_end = false;  // the device's last groups (a normal client over the reserve)
  bool operator==(const GreenShape&) const = default;
};

struct GreenContext {
  CUgreenCtx green = nullptr;
  CUcontext context = nullptr;  // cuCtxFromGreenCtx: what events of this client are made in
  unsigned sm_count = 0;        // the SMs the driver really gave
  GreenShape shape;             // what it was made from (the pool's key)
  // What it was made for, so that a session moving back to a shape it had reuses it
  // (sm_quota_change.hpp): the SM percentage, and whether the SMs reserved for normal-priority
  // clients were left out (priority_reserve.hpp), and how many of its quota's SMs that cost.
  int percentage = 0;
  bool outside_reserve = false;
  unsigned held_back_sms = 0;
};

// Where on the device a client's SMs lie: slot `slot` of `slots` equal parts. Without one, a
// split takes the device's first SMs, so every client with the same quota gets the same SMs.
// With one (a Kubernetes allocation: its replica), the clients of different slots get
// different SMs, and all the processes of one allocation the same ones: one SM share per pod.
// A static SM partition (mpsshimctl sm_partition add) places a client instead: its groups
// `first_group` .. `first_group + groups - 1` of the device split in steps of the hardware
// granularity, which no other partition has. A normal-priority client on a server that
// reserves SMs for them (priority_reserve.hpp) takes its share from the device's last groups,
// where the reserved ones lie, instead of the first.
struct SmPlacement {
  unsigned slot = 0;
  unsigned slots = 0;           // 0: no placement
  std::uint32_t partition = 0;  // its id; 0: none
  unsigned first_group = 0;
  unsigned groups = 0;
  bool at_device_end = false;
  bool placed() const { return slots != 0 || partition != 0 || at_device_end; }
};

// The quota of `percentage` for a client placed as `placement`: of the device, or of its
// partition (whose clients split in the hardware's steps, whatever MPSSHIM_SM_GRANULARITY says),
// and the granularity of the split.
struct PlannedQuota {
  SmQuota quota;
  unsigned granularity = 0;
  bool ignore_coscheduling = false;
};
PlannedQuota plan_client_quota(const proto::DeviceSnapshot& snapshot, int percentage,
                               bool ignore_coscheduling, const SmPlacement& placement);

// Building green contexts is serialized across the server's threads (the coordinator admits,
// every worker moves its own sessions: live quota changes, the priority reserve). The real
// driver fails cuDevSmResourceSplitByCount with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION when
// another thread of the process splits at the same time, and a process that met that may fail
// its next split too (tools/probes/green_concurrency.cpp, H200, driver 580: 4 threads at once
// 60 of 80 splits failed, taking turns 0 of 160). count_sm_groups, make_green_context and
// make_green_outside_reserve hold this from their first split to cuGreenCtxCreate; builds are
// rare (a pooled context is reused without one) and take ~1 ms.
[[nodiscard]] std::unique_lock<std::mutex> hold_green_builds();

// How many groups of `granularity` SMs the device's SM resource splits into (a static
// partition is a run of them; fewer than sm_count / granularity where GPCs leave SMs over).
tl::expected<unsigned, CUresult> count_sm_groups(const DriverTable& cu,
                                                 const CUdevResource& device_sms,
                                                 unsigned granularity);

// The first of `groups` equal SM groups that slot `slot` of `slots` starts at, when a client
// needs `needed` of them: slot * groups / slots, moved back so the run fits.
unsigned first_group_of_slot(unsigned slot, unsigned slots, unsigned groups, unsigned needed);

// The shape make_green_context gives these arguments.
GreenShape green_shape(const SmQuota& quota, unsigned granularity, const SmPlacement& placement);

// cuDevResourceGenerateDesc -> cuGreenCtxCreate -> cuCtxFromGreenCtx over `resources` (the
// whole device's SM resource, or outputs of one split). The caller holds hold_green_builds().
tl::expected<GreenContext, CUresult> green_context_of(const DriverTable& cu, CUdevice device,
                                                      std::vector<CUdevResource> resources);

// cuDevSmResourceSplitByCount -> cuDevResourceGenerateDesc -> cuGreenCtxCreate. The
// whole-device quota skips the split. Without a placement: one group of quota.target SMs; with
// one: the device split into groups of `granularity` SMs and the run of them the slot gets.
tl::expected<GreenContext, CUresult> make_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota,
                                                        unsigned granularity = 0,
                                                        SmPlacement placement = {});

}  // namespace mpsshim::server

// A client's green context: the SMs of its quota, split off the device's SM resource.
#pragma once

#include <cuda.h>

#include <tl/expected.hpp>

#include "broker/server/driver_table.hpp"
#include "broker/server/quota.hpp"

namespace mpsshim::server {

struct GreenContext {
  CUgreenCtx green = nullptr;
  CUcontext context = nullptr;  // cuCtxFromGreenCtx: what events of this client are made in
  unsigned sm_count = 0;        // the SMs the driver really gave
};

// Where on the device a client's SMs lie: slot `slot` of `slots` equal parts. Without one, a
// split takes the device's first SMs, so every client with the same quota gets the same SMs.
// With one (a Kubernetes allocation: its replica), the clients of different slots get
// different SMs, and all the processes of one allocation the same ones: one SM share per pod.
struct SmPlacement {
  unsigned slot = 0;
  unsigned slots = 0;  // 0: no placement
};

// The first of `groups` equal SM groups that slot `slot` of `slots` starts at, when a client
// needs `needed` of them: slot * groups / slots, moved back so the run fits.
unsigned first_group_of_slot(unsigned slot, unsigned slots, unsigned groups, unsigned needed);

// cuDevSmResourceSplitByCount -> cuDevResourceGenerateDesc -> cuGreenCtxCreate. The
// whole-device quota skips the split. Without a placement: one group of quota.target SMs; with
// one: the device split into groups of `granularity` SMs and the run of them the slot gets.
tl::expected<GreenContext, CUresult> make_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota,
                                                        unsigned granularity = 0,
                                                        SmPlacement placement = {});

}  // namespace mpsshim::server

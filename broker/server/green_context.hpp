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

// cuDevSmResourceSplitByCount (one group) -> cuDevResourceGenerateDesc -> cuGreenCtxCreate.
// The whole-device quota skips the split.
tl::expected<GreenContext, CUresult> make_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota);

}  // namespace mpsshim::server

// A kernel's parameters as the driver lays them out in its argument block, and the
// kernelParams form of a block: one pointer per parameter.
//
// The client's shim packs a launch's arguments into one block by this layout (the server sends
// it with every function it hands out: FunctionRep). cuLaunchKernelEx takes the block as is
// (`extra`, CU_LAUNCH_PARAM_BUFFER_POINTER); a graph kernel node does not: the real driver
// refuses `extra` in cuGraphAddKernelNode and cuGraphExecKernelNodeSetParams with
// CUDA_ERROR_INVALID_VALUE (H100, driver 580: tools/probes/graph_node_args.cpp), so a node's
// arguments go as kernelParams pointing into the block.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "broker/server/driver/driver_table.hpp"

namespace mpsshim::server {

struct ParamLayout {
  struct Param {
    std::uint32_t offset = 0;
    std::uint32_t size = 0;
  };
  std::vector<Param> params;  // in the kernel's order
  std::uint32_t bytes = 0;    // where the last parameter ends: the block's least size
};

// Asks the driver (cuKernelGetParamInfo for a CUkernel: cuFuncGetParamInfo refuses one with
// INVALID_HANDLE on the real driver; cuFuncGetParamInfo for a CUfunction) until it answers
// INVALID_VALUE past the last parameter. Another error is returned as is.
CUresult read_param_layout(const DriverTable& cu, CUfunction function, bool kernel,
                           ParamLayout& out);

// Fills `out` with one pointer per parameter into `block`, which holds at least layout.bytes.
// Returns out.data(), or nullptr for a kernel without parameters (kernelParams may be null).
void** point_at_params(const ParamLayout& layout, std::byte* block, std::vector<void*>& out);

}  // namespace mpsshim::server

// A stream memory operation in its wire form (proto/ops_stream_mem.hpp), checked as the driver
// checks it: flags the operation takes, and an address of memory the client holds, aligned and
// reachable from the context's GPU. Stream memory operations (stream_mem.cpp) and batch memory
// operation nodes (graph_control_nodes.cpp) send what these give.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "libshim/client.hpp"
#include "proto/ops_stream_mem.hpp"

namespace mpsshim::shim {

// `out.stream` is 0: the caller names the stream, if any.
CUresult wire_mem_op(Context* ctx, proto::StreamMemOpKind kind, CUdeviceptr address,
                     std::uint64_t value, unsigned flags, proto::StreamMemOpReq& out);
CUresult wire_mem_op(Context* ctx, const CUstreamBatchMemOpParams& op, proto::StreamMemOpReq& out);

}  // namespace mpsshim::shim

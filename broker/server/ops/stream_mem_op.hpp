// One stream memory operation as the client sent it, checked and in the driver's form: for the
// stream calls (ops/stream_mem.cpp) and batch memory operation nodes
// (ops/graph_control_nodes.cpp).
#pragma once

#include <cuda.h>

#include <optional>

#include "broker/server/ops/call.hpp"
#include "proto/ops_stream_mem.hpp"

namespace mpsshim::server {

// nullopt for an operation the client may not name: an unknown kind, a misaligned address, or
// memory that is not the client's.
std::optional<CUstreamBatchMemOpParams> driver_mem_op(Call& call, const proto::StreamMemOpReq& op);

}  // namespace mpsshim::server

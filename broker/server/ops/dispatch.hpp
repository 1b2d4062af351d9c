// Executes one ring record: copies it out of shared memory, checks it against its opcode's
// layout, runs the handler, and answers (reply slot, async_error, or later by a completion).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <span>
#include <string>

#include "broker/server/session/session.hpp"
#include "proto/ops.hpp"

namespace mpsshim::server {

// The biggest record any opcode can need (a launch with every attribute and the most argument
// bytes), rounded up. A bigger one is malformed.
inline constexpr std::size_t kMaxRecordBytes = 64 * 1024;

struct DispatchOutcome {
  enum class Kind { kOk, kEndSession, kSticky };
  Kind kind = Kind::kOk;
  std::string why;                 // kEndSession: for the log
  CUresult notify = CUDA_SUCCESS;  // kEndSession: stored as the client's fault (0: none)
  CUresult sticky = CUDA_SUCCESS;  // kSticky: the error that poisoned the GPU
  proto::Op op = proto::Op::kPad;
  std::uint32_t reply_slot = proto::kNoReply;  // kSticky: the record's slot, not yet answered
};

// `record` is the record in shared memory (header included), as RingConsumer::peek gave it.
// The bytes are copied before anything is read from them.
DispatchOutcome dispatch_record(Session& session, std::span<const std::byte> record);

// "kLaunchKernel" etc., for logs.
const char* op_name(proto::Op op);

}  // namespace mpsshim::server

// Payload of the stream memory operation opcode (Op 115): cuStreamWaitValue32/64,
// cuStreamWriteValue32/64 and each operation of cuStreamBatchMemOp, in stream order on the
// client's stream. The address is checked against the client's own memory (device, opened or
// pinned host memory) before the driver sees it.
#pragma once

#include <cstdint>
#include <optional>

#include "proto/ops.hpp"

namespace mpsshim::proto {

enum class StreamMemOpKind : std::uint32_t {
  kWait32 = 1,
  kWait64 = 2,
  kWrite32 = 3,
  kWrite64 = 4,
  kFlushRemoteWrites = 5,  // CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES (no address)
  kBarrier = 6,            // CU_STREAM_MEM_OP_BARRIER (no address; flags: the scope)
};

// The bytes an operation reads or writes at its address: 4 or 8, 0 for those without an
// address; nullopt for a kind that is none of the above.
constexpr std::optional<std::uint64_t> stream_mem_op_width(StreamMemOpKind kind) {
  switch (kind) {
    case StreamMemOpKind::kWait32:
    case StreamMemOpKind::kWrite32:
      return 4;
    case StreamMemOpKind::kWait64:
    case StreamMemOpKind::kWrite64:
      return 8;
    case StreamMemOpKind::kFlushRemoteWrites:
    case StreamMemOpKind::kBarrier:
      return 0;
  }
  return std::nullopt;
}

struct StreamMemOpReq {
  WireHandle stream;
  std::uint64_t address;
  std::uint64_t value;
  std::uint32_t kind;   // StreamMemOpKind
  std::uint32_t flags;  // CUstreamWaitValue_flags / CUstreamWriteValue_flags / the barrier's
};

static_assert(kWireSafe<StreamMemOpReq> && sizeof(StreamMemOpReq) == 32);

}  // namespace mpsshim::proto

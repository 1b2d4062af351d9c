// Payloads of the JIT linker opcodes (ops 130..133): cuLinkCreate, cuLinkAddData, cuLinkAddFile,
// cuLinkComplete and cuLinkDestroy on the server's driver (docs/cuda-runtime.md, "Linking at
// run time"). numba-cuda and CuPy link device code so.
//
// The link state lives in the server. An input (data, or a file's bytes, which only the client can
// read) travels as a memfd; the server hands a file's to the driver as a file, so that archives
// (CU_JIT_INPUT_LIBRARY) are read as the driver reads them. The linked image comes back as a memfd
// the client keeps until cuLinkDestroy, as the driver's own buffer would be.
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

// A JIT option whose value is a plain number (the value the caller cast to a pointer). The log
// buffers, the wall time and the options naming host memory are never sent: the server keeps its
// own log buffers and reports their text and the wall time in every LinkLogRep.
struct WireJitOption {
  std::uint32_t option;  // CUjit_option
  std::uint32_t reserved;
  std::uint64_t value;
};
inline constexpr std::uint32_t kMaxJitOptions = 64;
// The most log text a link keeps per buffer, whatever the caller's buffer holds.
inline constexpr std::uint32_t kMaxJitLogBytes = 1u << 20;

// kLinkCreate -> GraphRep (the link's id). Followed by option_count WireJitOptions.
struct LinkCreateReq {
  WireHandle ctx;
  std::uint32_t info_log_bytes;   // the caller's CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES; 0: none
  std::uint32_t error_log_bytes;  // the caller's CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES; 0: none
  std::uint32_t option_count;
  std::uint32_t reserved;
};

enum class LinkInput : std::uint32_t { kData = 0, kFile = 1 };

// kLinkAdd -> LinkLogRep. The input's bytes are the memfd sent under `token`. Followed by
// name_bytes of name (cuLinkAddData's name, or the file's path), padded to 8 bytes, then
// option_count WireJitOptions (the input's own options).
struct LinkAddReq {
  WireHandle link;
  std::uint64_t bytes;
  std::uint32_t token;
  std::uint32_t type;   // CUjitInputType
  std::uint32_t input;  // LinkInput
  std::uint32_t name_bytes;
  std::uint32_t option_count;
  std::uint32_t reserved;
};

// The answer to kLinkAdd and kLinkComplete: the logs' text so far (info, then error; each cut to
// what fits, the error log first) and, for a completed link, the linked image's size (its memfd
// came before the answer).
struct LinkLogRep {
  std::uint64_t image_bytes;
  float wall_time_ms;  // CU_JIT_WALL_TIME of the last step
  std::uint32_t info_bytes;
  std::uint32_t error_bytes;
  std::uint32_t reserved;
  char text[kSlotPayloadBytes - 24];
};

static_assert(kWireSafe<WireJitOption> && sizeof(WireJitOption) == 16);
static_assert(kWireSafe<LinkCreateReq> && sizeof(LinkCreateReq) == 24);
static_assert(kWireSafe<LinkAddReq> && sizeof(LinkAddReq) == 40);
static_assert(kWireSafe<LinkLogRep> && sizeof(LinkLogRep) == kSlotPayloadBytes);

}  // namespace mpsshim::proto

// Payloads of the green-context opcodes (Op 146..149): a client's own green contexts.
//
// A CUdevResource is 144 bytes the driver reads back: its public fields (the type, the SM
// count) and 92 opaque ones that name the SMs. The server hands the client its quota's SM
// resource (cuGreenCtxGetDevResource of the client's green context) and the outputs of the
// splits it makes of them, and accepts back only bytes it handed out: a resource the client
// wrote itself could name SMs outside its quota (docs/green-contexts.md).
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

// sizeof(CUdevResource) in CUDA 12.4 through 13 (RESOURCE_ABI_VERSION 1).
inline constexpr std::uint32_t kDevResourceBytes = 144;
// Split outputs in one answer; a longer split is asked again from `first` on (the driver
// splits alike every time: tools/probes/green_nested.cu).
inline constexpr std::uint32_t kGreenSplitPage = 26;
// Resources in one descriptor: a split gives at most one group per 2 SMs of 132 (H200) plus its
// remainder; more than this is refused as the driver refuses a too-long list.
inline constexpr std::uint32_t kGreenDescMaxResources = 128;

struct DevResource {
  std::uint8_t bytes[kDevResourceBytes];
};

// The SM resource of one of the client's contexts (0: its quota, which cuDeviceGetDevResource
// and a context without a green context of its own answer).
struct GreenResourceReq {
  WireHandle ctx;
  std::uint32_t type;  // CUdevResourceType
  std::uint32_t reserved;
};

// cuDevSmResourceSplitByCount of `input`: `groups` 0 only counts (a NULL result); otherwise up
// to `groups` outputs, those from `first` on in the answer.
struct GreenSplitReq {
  DevResource input;
  std::uint32_t groups;
  std::uint32_t min_count;
  std::uint32_t flags;
  std::uint32_t first;
};
struct GreenSplitRep {
  std::uint32_t groups;  // made (or, counting, that would be made)
  std::uint32_t count;   // outputs in `result`, from `first` on
  DevResource remaining;
  DevResource result[kGreenSplitPage];
};

// cuDevResourceGenerateDesc over `count` resources, which follow the request.
struct GreenDescReq {
  std::uint32_t count;
  std::uint32_t reserved;
};
struct GreenDescRep {
  WireHandle desc;
};

// cuGreenCtxCreate: a client context whose streams run on the descriptor's SMs.
struct GreenCtxCreateReq {
  WireHandle desc;
  std::uint32_t flags;
  std::uint32_t reserved;
};
struct GreenCtxCreateRep {
  WireHandle ctx;
  WireHandle default_stream;
  std::uint32_t sm_count;
  std::uint32_t reserved;
};

#define MPSSHIM_WIRE_CHECK(T)                                    \
  static_assert(kWireSafe<T>, #T " must be trivially copyable"); \
  static_assert(sizeof(T) % 8 == 0, #T " must pad to 8 bytes");
MPSSHIM_WIRE_CHECK(DevResource)
MPSSHIM_WIRE_CHECK(GreenResourceReq)
MPSSHIM_WIRE_CHECK(GreenSplitReq)
MPSSHIM_WIRE_CHECK(GreenSplitRep)
MPSSHIM_WIRE_CHECK(GreenDescReq)
MPSSHIM_WIRE_CHECK(GreenDescRep)
MPSSHIM_WIRE_CHECK(GreenCtxCreateReq)
MPSSHIM_WIRE_CHECK(GreenCtxCreateRep)
#undef MPSSHIM_WIRE_CHECK
static_assert(sizeof(GreenSplitRep) <= kSlotPayloadBytes);

}  // namespace mpsshim::proto

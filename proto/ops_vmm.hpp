// Payloads of the virtual memory management opcodes (Op 78..88): cuMemCreate's physical
// allocations, cuMemAddressReserve's address ranges and cuMemMap's mappings, all owned by the
// server (docs/vmm.md).
//
// A physical allocation is named by a server-issued WireHandle of the client's session, never
// by the driver's CUmemGenericAllocationHandle. Addresses (reservations, mappings) are real
// device addresses, checked by the server against the client's own reservations and mappings.
// A location's device is the server's one GPU: the client sends the location type only and
// the server puts in its own device.
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

// CUmemAllocationProp without its pointer (win32HandleMetaData, which must be 0 on Linux).
struct VmmProp {
  std::uint32_t type;           // CUmemAllocationType
  std::uint32_t handle_types;   // CUmemAllocationHandleType bits requested
  std::uint32_t location_type;  // CUmemLocationType
  std::uint8_t compression;     // allocFlags.compressionType
  std::uint8_t rdma_capable;    // allocFlags.gpuDirectRDMACapable
  std::uint16_t usage;          // allocFlags.usage
};

struct VmmGranularityReq {
  VmmProp prop;
  std::uint32_t option;  // CUmemAllocationGranularity_flags
  std::uint32_t reserved;
};
struct VmmGranularityRep {
  std::uint64_t bytes;
};

struct VmmCreateReq {
  VmmProp prop;
  std::uint32_t reserved;
  std::uint64_t bytes;
  std::uint64_t flags;  // must be 0
};
// Reply of kVmmCreate and kVmmRetain.
struct VmmHandleRep {
  WireHandle handle;
};
// kVmmRelease and kVmmGetProperties take a HandleReq; kVmmGetProperties answers a VmmProp.

// kVmmImport: the kPeerMemory fd transfer with this token holds the shareable handle.
struct VmmImportReq {
  std::uint32_t token;
  std::uint32_t reserved;
};

struct VmmReserveReq {
  std::uint64_t bytes;
  std::uint64_t alignment;  // 0: the allocation granularity
  std::uint64_t address;    // a wished start, 0: anywhere
  std::uint64_t flags;      // must be 0
};
struct VmmAddressRep {
  std::uint64_t address;
};

// kVmmAddressFree and kVmmUnmap.
struct VmmRangeReq {
  std::uint64_t address;
  std::uint64_t bytes;
};

struct VmmMapReq {
  std::uint64_t address;
  std::uint64_t bytes;
  std::uint64_t offset;  // into the physical allocation
  WireHandle handle;
  std::uint64_t flags;  // must be 0
};

// CUmemAccessDesc for the server's device (location type CU_MEM_LOCATION_TYPE_DEVICE).
struct VmmAccessDesc {
  std::uint32_t location_type;
  std::uint32_t flags;  // CUmemAccess_flags
};
// Followed by `count` VmmAccessDescs.
struct VmmSetAccessReq {
  std::uint64_t address;
  std::uint64_t bytes;
  std::uint32_t count;
  std::uint32_t reserved;
};
inline constexpr std::uint32_t kMaxVmmAccessDescs = 64;

struct VmmGetAccessReq {
  std::uint64_t address;
  std::uint32_t location_type;
  std::uint32_t reserved;
};
struct VmmGetAccessRep {
  std::uint64_t flags;
};

// kVmmRetain: the allocation mapped at `address`.
struct VmmRetainReq {
  std::uint64_t address;
};

#define MPSSHIM_WIRE_CHECK(T)                                    \
  static_assert(kWireSafe<T>, #T " must be trivially copyable"); \
  static_assert(sizeof(T) % 8 == 0, #T " must pad to 8 bytes");
MPSSHIM_WIRE_CHECK(VmmProp)
MPSSHIM_WIRE_CHECK(VmmGranularityReq)
MPSSHIM_WIRE_CHECK(VmmGranularityRep)
MPSSHIM_WIRE_CHECK(VmmCreateReq)
MPSSHIM_WIRE_CHECK(VmmHandleRep)
MPSSHIM_WIRE_CHECK(VmmReserveReq)
MPSSHIM_WIRE_CHECK(VmmAddressRep)
MPSSHIM_WIRE_CHECK(VmmRangeReq)
MPSSHIM_WIRE_CHECK(VmmMapReq)
MPSSHIM_WIRE_CHECK(VmmAccessDesc)
MPSSHIM_WIRE_CHECK(VmmSetAccessReq)
MPSSHIM_WIRE_CHECK(VmmGetAccessReq)
MPSSHIM_WIRE_CHECK(VmmGetAccessRep)
MPSSHIM_WIRE_CHECK(VmmRetainReq)
#undef MPSSHIM_WIRE_CHECK
static_assert(sizeof(VmmProp) == 16);
static_assert(sizeof(VmmGranularityReq) == 24);
static_assert(sizeof(VmmCreateReq) == 40);
static_assert(sizeof(VmmMapReq) == 40);
static_assert(sizeof(VmmSetAccessReq) == 24);

static_assert(kWireSafe<VmmImportReq> && sizeof(VmmImportReq) == 8);

}  // namespace mpsshim::proto

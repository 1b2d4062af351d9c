// Payloads of ops 139..141: the queries of a CUDA array the shim cannot answer itself, a dma-buf
// fd for a range of device memory (cuMemGetHandleForAddressRange), and the driver's smaller
// settings and queries that only the server's driver can answer
// (broker/server/ops/driver_extras.cpp, docs/cuda-runtime.md).
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

// kArrayQuery -> ArrayQueryRep.
enum class ArrayQuery : std::uint32_t {
  kSparseProperties = 0,    // cuArrayGetSparseProperties
  kMemoryRequirements = 1,  // cuArrayGetMemoryRequirements (the array's own device)
};
struct ArrayQueryReq {
  WireHandle array;
  std::uint32_t query;      // ArrayQuery
  std::uint32_t mipmapped;  // 1: `array` is a mipmapped array (cuMipmappedArrayGet*)
};
struct ArrayQueryRep {
  std::uint64_t size;       // memory requirements; sparse: the mip tail's size
  std::uint64_t alignment;  // memory requirements
  std::uint32_t tile_extent[3];
  std::uint32_t miptail_first_level;
  std::uint32_t flags;
  std::uint32_t reserved;
};

// kMemRangeHandle: a dma-buf fd of [dptr, dptr + bytes) of the client's device memory, sent on
// the client's socket (FdTransfer kPeerMemory) before the answer.
struct MemRangeHandleReq {
  std::uint64_t dptr;
  std::uint64_t bytes;
  std::uint32_t type;  // CUmemRangeHandleType
  std::uint32_t reserved;
  std::uint64_t flags;
};

// kDriverSetting -> GraphNodeValueRep.
enum class DriverSetting : std::uint32_t {
  kResetPersistingL2 = 0,  // cuCtxResetPersistingL2Cache
  kFlushRdmaWrites = 1,    // cuFlushGPUDirectRDMAWrites(a = target, b = scope)
  // 2 is not used: the shim keeps cuPointerSetAttribute's mark (libshim/sync_memops.hpp).
  kTexture1DLinearMaxWidth = 3,  // cuDeviceGetTexture1DLinearMaxWidth(a = format, b = channels)
  kHostAtomicCapabilities = 4,   // cuDeviceGetHostAtomicCapabilities of operation a
  kP2PAtomicCapabilities = 5,    // ... P2P: operation a, to the GPU of physical ordinal b
};
struct DriverSettingReq {
  std::uint32_t setting;  // DriverSetting
  std::uint32_t a;
  std::uint64_t b;
  std::uint64_t c;
};

// kMemDecompress: cuMemBatchDecompressAsync on `stream`; `count` WireDecompressParams follow.
// Every address is the client's own memory, checked by the server before the driver sees it.
struct MemDecompressReq {
  WireHandle stream;
  std::uint32_t count;
  std::uint32_t flags;
};
struct WireDecompressParams {
  std::uint64_t src_bytes;
  std::uint64_t dst_bytes;
  std::uint64_t dst_act_bytes;  // where the driver writes the 32-bit count it wrote
  std::uint64_t src;
  std::uint64_t dst;
  std::uint32_t algo;  // CUmemDecompressAlgorithm
  std::uint32_t reserved;
};
struct MemDecompressRep {
  // The driver's errorIndex: an operation, kDecompressNotAboutOne, or kDecompressIndexUnset
  // (the driver left it as it was).
  std::uint64_t error_index;
};
inline constexpr std::uint64_t kDecompressNotAboutOne = ~std::uint64_t{0};
inline constexpr std::uint64_t kDecompressIndexUnset = ~std::uint64_t{0} - 1;
// Operations in one record (the ring's largest record holds ~5,400); the shim sends longer
// lists in parts.
inline constexpr std::uint32_t kDecompressMaxOperations = 4096;

static_assert(kWireSafe<ArrayQueryReq> && sizeof(ArrayQueryReq) == 16);
static_assert(kWireSafe<ArrayQueryRep> && sizeof(ArrayQueryRep) == 40);
static_assert(kWireSafe<MemRangeHandleReq> && sizeof(MemRangeHandleReq) == 32);
static_assert(kWireSafe<DriverSettingReq> && sizeof(DriverSettingReq) == 24);
static_assert(kWireSafe<MemDecompressReq> && sizeof(MemDecompressReq) == 16);
static_assert(kWireSafe<WireDecompressParams> && sizeof(WireDecompressParams) == 48);
static_assert(kWireSafe<MemDecompressRep> && sizeof(MemDecompressRep) == 8);

}  // namespace mpsshim::proto

// Everything a client may ask about a device without a round trip, captured once by the server
// at start-up and sent to every client at connect.
#pragma once

#include <cstdint>

#include "proto/abi.hpp"

namespace mpsshim::proto {

// Indexed by CUdevice_attribute. CUDA 13.0 defines 1..~150; the array leaves room to grow
// without an ABI change. An attribute the driver refused reads 0 (as the real driver reports
// for unsupported ones).
inline constexpr std::uint32_t kMaxDeviceAttributes = 256;

struct DeviceSnapshot {
  char name[256];
  std::uint8_t uuid[16];
  std::uint64_t total_memory;
  std::int32_t driver_version;  // cuDriverGetVersion of the server's driver
  std::int32_t ordinal;         // physical ordinal on the server's host
  std::uint32_t sm_count;       // cuDeviceGetDevResource(SM)
  std::uint32_t sm_min_partition;
  std::uint32_t sm_coscheduled_alignment;
  std::uint32_t attribute_count;  // entries of `attributes` that were queried
  std::int32_t attributes[kMaxDeviceAttributes];
  std::int32_t stream_priority_least;
  std::int32_t stream_priority_greatest;
  // The server's arena (proto/address_arenas.hpp): every device address it hands out lies in
  // [arena_base, arena_base + arena_bytes). 0, 0: it lets the driver place its memory.
  std::uint64_t arena_base;
  std::uint64_t arena_bytes;
  // Peers, by physical ordinal (bit i: GPU i): cuDeviceCanAccessPeer from this GPU, and
  // cuDeviceGetP2PAttribute's native atomics and CUDA array access, as the server's driver
  // answered them; the performance rank of each is 0 (one link kind per host).
  std::uint32_t peer_access_mask;
  std::uint32_t peer_atomics_mask;
  std::uint32_t peer_array_mask;
  std::uint32_t reserved;
};
static_assert(kWireSafe<DeviceSnapshot>);
static_assert(sizeof(DeviceSnapshot) == 1368);
static_assert(offsetof(DeviceSnapshot, uuid) == 256);
static_assert(offsetof(DeviceSnapshot, total_memory) == 272);
static_assert(offsetof(DeviceSnapshot, attributes) == 304);
static_assert(offsetof(DeviceSnapshot, arena_base) == 1336);

}  // namespace mpsshim::proto

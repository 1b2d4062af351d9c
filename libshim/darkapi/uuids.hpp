// Export-table UUIDs: the 16 raw bytes of CUuuid in memory order, written as in
// docs/private-tables.md. Compare all 16 with memcmp; never convert to or from the mixed-endian
// GUID text form.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace mpsshim::shim::darkapi {

using Uuid = std::array<std::uint8_t, 16>;

// 32 lowercase hex digits, memory order. A typo fails to compile.
consteval Uuid uuid(const char (&hex)[33]) {
  auto nibble = [](char c) -> std::uint8_t {
    if (c >= '0' && c <= '9') return static_cast<std::uint8_t>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<std::uint8_t>(c - 'a' + 10);
    throw "not a lowercase hex digit";  // reached only at compile time: a compile error
  };
  Uuid out{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

// Served.
inline constexpr Uuid kCudartInterfaceId = uuid("6bd5fb6c5bf4e74a8987d93912fd9df9");
inline constexpr Uuid kCallbackHooksId = uuid("a094798c2e742e7493f20800200c0a66");
inline constexpr Uuid kToolsTlsId = uuid("42d85a8123f6cb478298f6e78a3aecdc");
inline constexpr Uuid kContextLocalStorageId = uuid("c693336e1121df11a8c368f355d89593");
inline constexpr Uuid kContextChecksId = uuid("263e88607cd2614392f6bbd5006dfa7e");
inline constexpr Uuid kIntegrityCheckId = uuid("d4082055bde6704b8d34ba123c66e1f2");
inline constexpr Uuid kToolsContextId = uuid("21318c60971432488ca641ff7324c8f2");
inline constexpr Uuid kToolsModuleId = uuid("6e163fbeb958444d835ce182aff1991e");

// Served by the host's real driver (host_driver_tables.cpp): cuBLASLt's table for its nvjet
// kernels, whose slots compute on host memory only.
inline constexpr Uuid kCublasLtKernelsId = uuid("1734dc26800d47458726c0f1e7dd8bca");

// Known and refused on purpose (§2.7, §2.9, §2.10): success with F8 would make cudart skip its
// normal bootstrap; NVML and NVRTC work without their driver hooks.
inline constexpr Uuid kF8Id = uuid("f8cff95121468b4eb9e2fb469e7c0dd9");
inline constexpr Uuid kNvmlInterfaceId = uuid("69a28e9f24498b47b030c5da330ea4e9");
inline constexpr Uuid kNvrtcInterfaceId = uuid("da9151d33ae6cc41a5c04f26d533e328");

}  // namespace mpsshim::shim::darkapi

// Fetching the shim's tables the way cudart does, and reading their slots as raw words.
#pragma once

#include <cuda.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "tests/darkapi/hex.hpp"

namespace mpsshim::test {

inline CUuuid uuid_of(std::string_view hex) {
  CUuuid id{};
  const auto bytes = from_hex(hex);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<std::uint8_t*>(id.bytes));
  return id;
}

inline const std::uintptr_t* export_table(std::string_view hex) {
  const CUuuid id = uuid_of(hex);
  const void* table = nullptr;
  REQUIRE(cuGetExportTable(&table, &id) == CUDA_SUCCESS);
  REQUIRE(table != nullptr);
  return static_cast<const std::uintptr_t*>(table);
}

// Slot `slot` of `table` as a function of type Fn.
template <class Fn>
Fn slot_fn(const std::uintptr_t* table, std::size_t slot) {
  return reinterpret_cast<Fn>(table[slot]);
}

inline constexpr std::string_view kCudartInterface = "6bd5fb6c5bf4e74a8987d93912fd9df9";
inline constexpr std::string_view kCallbackHooks = "a094798c2e742e7493f20800200c0a66";
inline constexpr std::string_view kToolsTls = "42d85a8123f6cb478298f6e78a3aecdc";
inline constexpr std::string_view kContextLocalStorage = "c693336e1121df11a8c368f355d89593";
inline constexpr std::string_view kToolsModule = "6e163fbeb958444d835ce182aff1991e";
inline constexpr std::string_view kContextChecks = "263e88607cd2614392f6bbd5006dfa7e";
inline constexpr std::string_view kIntegrityCheck = "d4082055bde6704b8d34ba123c66e1f2";
inline constexpr std::string_view kToolsContext = "21318c60971432488ca641ff7324c8f2";

}  // namespace mpsshim::test

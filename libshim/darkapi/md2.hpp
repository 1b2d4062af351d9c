// MD2 (RFC 1319), the hash under the INTEGRITY_CHECK table's HMAC
// (docs/private-tables.md, "The hash").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace mpsshim::shim {

inline constexpr std::size_t kMd2BlockSize = 16;
using Md2Digest = std::array<std::uint8_t, 16>;

class Md2 {
 public:
  // The whole state in one array, laid out as ZLUDA and smolvm do (their test vectors read it):
  // [0,16) X state, [16,32) block, [32,48) state^block, [48,64) checksum, [64] n, [65] L.
  using State = std::array<std::uint8_t, 66>;

  void update(std::span<const std::uint8_t> data) noexcept;
  void update(std::uint8_t byte) noexcept;
  // Pads, absorbs the checksum and returns the digest; the object is then spent.
  Md2Digest finish() noexcept;

  const State& state() const noexcept { return s_; }

 private:
  void compress() noexcept;

  State s_{};
};

Md2Digest md2(std::span<const std::uint8_t> data) noexcept;

}  // namespace mpsshim::shim

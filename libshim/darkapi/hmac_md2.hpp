// HMAC-MD2 (RFC 2104 over RFC 1319) with a key of exactly one MD2 block, the only form the
// integrity check needs: such a key is used as is, neither hashed nor padded.
#pragma once

#include <cstdint>
#include <span>

#include "libshim/darkapi/md2.hpp"

namespace mpsshim::shim {

class HmacMd2 {
 public:
  using Key = std::span<const std::uint8_t, kMd2BlockSize>;

  explicit HmacMd2(Key key) noexcept;

  void update(std::span<const std::uint8_t> data) noexcept { inner_.update(data); }
  // MD2((K ^ 0x36..) || message): the inner hash, exposed for test vectors. Spends the object.
  Md2Digest finish_inner() noexcept { return inner_.finish(); }
  // MD2((K ^ 0x5c..) || inner). Spends the object.
  Md2Digest finish() noexcept;

 private:
  std::array<std::uint8_t, kMd2BlockSize> key_;
  Md2 inner_;
};

Md2Digest hmac_md2(HmacMd2::Key key, std::span<const std::uint8_t> message) noexcept;

}  // namespace mpsshim::shim

#include "libshim/darkapi/hmac_md2.hpp"

#include <algorithm>

namespace mpsshim::shim {
namespace {

constexpr std::uint8_t kInnerPad = 0x36;
constexpr std::uint8_t kOuterPad = 0x5c;

void absorb_padded_key(Md2& h, HmacMd2::Key key, std::uint8_t pad) noexcept {
  for (const std::uint8_t byte : key) h.update(static_cast<std::uint8_t>(byte ^ pad));
}

}  // namespace

HmacMd2::HmacMd2(Key key) noexcept {
  std::copy(key.begin(), key.end(), key_.begin());
  absorb_padded_key(inner_, key, kInnerPad);
}

Md2Digest HmacMd2::finish() noexcept {
  const Md2Digest inner = finish_inner();
  Md2 outer;
  absorb_padded_key(outer, key_, kOuterPad);
  outer.update(inner);
  return outer.finish();
}

Md2Digest hmac_md2(HmacMd2::Key key, std::span<const std::uint8_t> message) noexcept {
  HmacMd2 h(key);
  h.update(message);
  return h.finish();
}

}  // namespace mpsshim::shim

#include "libshim/darkapi/integrity.hpp"

#include <bit>
#include <cstring>

#include "libshim/darkapi/hmac_md2.hpp"

namespace mpsshim::shim {
namespace {

template <class T>
std::size_t put_le(std::uint8_t* out, std::size_t at, T value) noexcept {
  static_assert(std::endian::native == std::endian::little, "the message is little-endian");
  std::memcpy(out + at, &value, sizeof value);
  return at + sizeof value;
}

HmacMd2 keyed_message(const IntegrityInputs& in, std::uint32_t version,
                      std::uint64_t unix_seconds) noexcept {
  HmacMd2 h(kIntegrityKey);
  h.update(integrity_header(in, version, unix_seconds));
  for (const IntegrityDevice& device : in.devices) h.update(integrity_record(device));
  return h;
}

// Versions ending in 0 or 1 get constants that depend on no input (measured, §4.1).
constexpr Md2Digest kDigestVersion0{0x5c, 0x67, 0xcb, 0x03, 0x1c, 0x18, 0x41, 0x33,
                                    0xe8, 0xd1, 0x4c, 0x1f, 0xaa, 0x83, 0xd3, 0x8e};
constexpr Md2Digest kDigestVersion1{0x5c, 0x67, 0xcb, 0x03, 0x1c, 0x18, 0x41, 0x18,
                                    0xe8, 0xd1, 0x4c, 0x1f, 0xaa, 0x83, 0xd3, 0x8e};

}  // namespace

IntegrityHeader integrity_header(const IntegrityInputs& in, std::uint32_t version,
                                 std::uint64_t unix_seconds) noexcept {
  IntegrityHeader out{};
  std::size_t at = 0;
  at = put_le(out.data(), at, in.driver_version);
  at = put_le(out.data(), at, version);
  at = put_le(out.data(), at, in.pid);
  at = put_le(out.data(), at, in.thread);
  // cudart_table precedes integrity_table, whatever order ZLUDA's parameters suggest.
  at = put_le(out.data(), at, in.cudart_table);
  at = put_le(out.data(), at, in.integrity_table);
  at = put_le(out.data(), at, in.fn_address);
  put_le(out.data(), at, unix_seconds);
  return out;
}

IntegrityRecord integrity_record(const IntegrityDevice& device) noexcept {
  IntegrityRecord out{};
  std::memcpy(out.data(), device.uuid.data(), device.uuid.size());
  std::size_t at = device.uuid.size();
  at = put_le(out.data(), at, device.pci_domain);
  at = put_le(out.data(), at, device.pci_bus);
  put_le(out.data(), at, device.pci_device);
  return out;
}

Md2Digest integrity_inner_digest(const IntegrityInputs& in, std::uint32_t version,
                                 std::uint64_t unix_seconds) noexcept {
  return keyed_message(in, version, unix_seconds).finish_inner();
}

Md2Digest integrity_digest(const IntegrityInputs& in, std::uint32_t version,
                           std::uint64_t unix_seconds) noexcept {
  switch (version % 10) {
    case 0:
      return kDigestVersion0;
    case 1:
      return kDigestVersion1;
    default:
      return keyed_message(in, version, unix_seconds).finish();
  }
}

}  // namespace mpsshim::shim

// The integrity check against every real-driver vector (580.159.04, 1 and 2 H200s;
// docs/private-tables.md, "Test vectors"), byte for byte, including the message pieces and the
// inner hash.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "libshim/darkapi/integrity.hpp"
#include "libshim/darkapi/md2.hpp"
#include "tests/darkapi/hex.hpp"

using mpsshim::shim::integrity_digest;
using mpsshim::shim::integrity_header;
using mpsshim::shim::integrity_inner_digest;
using mpsshim::shim::integrity_record;
using mpsshim::shim::IntegrityDevice;
using mpsshim::shim::IntegrityInputs;
using mpsshim::shim::kIntegrityKey;
using mpsshim::shim::Md2;
using mpsshim::test::from_hex;
using mpsshim::test::to_hex;

namespace {

IntegrityDevice device(std::string_view uuid_hex, std::int32_t domain, std::int32_t bus,
                       std::int32_t dev) {
  IntegrityDevice d{};
  const auto bytes = from_hex(uuid_hex);
  std::copy(bytes.begin(), bytes.end(), d.uuid.begin());
  d.pci_domain = domain;
  d.pci_bus = bus;
  d.pci_device = dev;
  return d;
}

// Set A: 1 x H200.
const std::vector<IntegrityDevice> kDevicesA{device("c96881506bed1af8ac8e9be350580222", 0, 0, 6)};
constexpr std::uint64_t kSecondsA = 1795252944;
IntegrityInputs inputs_a() {
  return IntegrityInputs{13000,          404,      0x9ff3e140, 0x7f939f24c680, 0x7f939f24c660,
                         0x7f9399bab350, kDevicesA};
}

// Set B: 2 x H200, records in ordinal order.
const std::vector<IntegrityDevice> kDevicesB{device("04c9f6286312ff63a810d32f42f0d4bf", 0, 0, 6),
                                             device("182dd796462bb296a9bc56e2cbd7d9bd", 0, 0, 7)};
constexpr std::uint64_t kSecondsB = 1795253071;
IntegrityInputs inputs_b() {
  // pthread_self 0x7f0b80b1f140 is hashed as its low 32 bits.
  return IntegrityInputs{13000,          547,      0x80b1f140, 0x7f0b7fe29680, 0x7f0b7fe29660,
                         0x7f0b7a788350, kDevicesB};
}

std::string digest(const IntegrityInputs& in, std::uint32_t version, std::uint64_t seconds) {
  return to_hex(integrity_digest(in, version, seconds));
}

}  // namespace

TEST_CASE("integrity: versions ending in 0 and 1 give the fixed constants", "[integrity]") {
  for (const auto& in : {inputs_a(), inputs_b()}) {
    CHECK(digest(in, 13000, kSecondsA) == "5c67cb031c184133e8d14c1faa83d38e");
    CHECK(digest(in, 13001, kSecondsB) == "5c67cb031c184118e8d14c1faa83d38e");
    CHECK(digest(in, 12080, 0) == "5c67cb031c184133e8d14c1faa83d38e");
    CHECK(digest(in, 0xFFFFFFFB, 0) == "5c67cb031c184118e8d14c1faa83d38e");  // 4294967291
  }
  // As result[0], result[1] (uint64 little-endian), the form the spec's table gives.
  const auto v0 = integrity_digest(inputs_a(), 13000, kSecondsA);
  std::uint64_t words[2];
  std::memcpy(words, v0.data(), sizeof words);
  CHECK(words[0] == 0x3341181C03CB675CULL);
  CHECK(words[1] == 0x8ED383AA1F4CD1E8ULL);
}

TEST_CASE("integrity: vector set A (1 GPU)", "[integrity]") {
  const IntegrityInputs in = inputs_a();
  CHECK(digest(in, 13002, kSecondsA) == "fe4ff5baefe99fbcbcf09d825b032698");
  CHECK(digest(in, 13005, kSecondsA) == "660b7db8be7931e561d9ed4d6a765fe0");
  CHECK(digest(in, 13009, kSecondsA) == "7fb0c3c9275e0030152438cd6da4d6ee");
  CHECK(digest(in, 12082, kSecondsA) == "50de5bf73d8559228d3b4f5498d23faf");
  CHECK(digest(in, 7, kSecondsA) == "1ff14d11b9100842ec41db6f080a5971");
}

TEST_CASE("integrity: set A intermediates for version 13002", "[integrity]") {
  const IntegrityInputs in = inputs_a();
  CHECK(to_hex(integrity_header(in, 13002, kSecondsA)) ==
        "c8320000ca3200009401000040e1f39f80c6249f937f000060c6249f937f0000"
        "50b3ba99937f0000d062016b00000000");
  CHECK(to_hex(integrity_record(kDevicesA[0])) ==
        "c96881506bed1af8ac8e9be350580222000000000000000006000000");
  CHECK(to_hex(integrity_inner_digest(in, 13002, kSecondsA)) == "09f710b2c066e92b678305c05d4cf6dd");
}

TEST_CASE("integrity: vector set B (2 GPUs)", "[integrity]") {
  const IntegrityInputs in = inputs_b();
  CHECK(digest(in, 13002, kSecondsB) == "30f77e05ad9da22769a85b4fc69f6cb3");
  CHECK(digest(in, 13005, kSecondsB) == "05f416e87738216b0da8222fba3e51bf");
  CHECK(digest(in, 13009, kSecondsB) == "362456dbc276e36577c7cb4be52a0881");
  CHECK(digest(in, 12082, kSecondsB) == "438407d2e320afb18c196a5e0728ced8");
  CHECK(digest(in, 7, kSecondsB) == "d6e650db349f3343192c453f1c8f5f94");
  CHECK(to_hex(integrity_header(in, 13002, kSecondsB)) ==
        "c8320000ca3200002302000040f1b1808096e27f0b7f00006096e27f0b7f0000"
        "5083787a0b7f00004f63016b00000000");
  CHECK(to_hex(integrity_inner_digest(in, 13002, kSecondsB)) == "96300d745a0b06b8adf3d05d5e90ae17");
}

TEST_CASE("integrity: device records are hashed in ordinal order", "[integrity]") {
  const std::vector<IntegrityDevice> swapped{kDevicesB[1], kDevicesB[0]};
  IntegrityInputs in = inputs_b();
  in.devices = swapped;
  for (const std::uint32_t version : {13002u, 13005u, 13009u, 12082u, 7u}) {
    CHECK(integrity_digest(in, version, kSecondsB) !=
          integrity_digest(inputs_b(), version, kSecondsB));
  }
  CHECK(digest(in, 13000, kSecondsB) == digest(inputs_b(), 13000, kSecondsB));
  CHECK(digest(in, 13001, kSecondsB) == digest(inputs_b(), 13001, kSecondsB));
}

TEST_CASE("integrity: ZLUDA's header vector reproduces their state", "[integrity]") {
  const IntegrityInputs in{0x2f30,         0x2fa423,       0xf79c1000, 0x7ffff6958240,
                           0x7ffff6958220, 0x7ffff2aaf4a0, {}};
  Md2 h;
  for (const std::uint8_t b : kIntegrityKey) h.update(static_cast<std::uint8_t>(b ^ 0x36));
  h.update(integrity_header(in, 12082, 0x682b9cee));
  CHECK(to_hex(std::span(h.state()).first(16)) == "0afdabc9ff9ba0be4d303282744fa748");
}

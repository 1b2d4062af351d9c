#include "broker/server/images/image.hpp"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace mpsshim::server {
namespace {

template <typename T>
void put(std::vector<std::byte>& bytes, std::size_t at, T value) {
  if (bytes.size() < at + sizeof value) bytes.resize(at + sizeof value);
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

std::vector<std::byte> fatbin(std::uint64_t fat_size, std::size_t actual_bytes) {
  std::vector<std::byte> bytes(actual_bytes);
  put<std::uint32_t>(bytes, 0, 0xBA55ED50u);
  put<std::uint16_t>(bytes, 4, 1);
  put<std::uint16_t>(bytes, 6, 16);
  put<std::uint64_t>(bytes, 8, fat_size);
  return bytes;
}

// An ELF64 with `sections` section headers after a 0x100-byte body; section 1 covers the body.
std::vector<std::byte> elf(std::uint16_t sections) {
  constexpr std::uint64_t kShoff = 0x140;
  std::vector<std::byte> bytes(kShoff + std::size_t{sections} * 64);
  put<std::uint32_t>(bytes, 0, 0x464C457Fu);
  put<std::uint8_t>(bytes, 4, 2);  // ELFCLASS64
  put<std::uint8_t>(bytes, 5, 1);  // little-endian
  put<std::uint64_t>(bytes, 0x28, kShoff);
  put<std::uint16_t>(bytes, 0x3A, 64);
  put<std::uint16_t>(bytes, 0x3C, sections);
  if (sections > 1) {
    put<std::uint32_t>(bytes, kShoff + 64 + 0x04, 1);  // PROGBITS
    put<std::uint64_t>(bytes, kShoff + 64 + 0x18, 0x40);
    put<std::uint64_t>(bytes, kShoff + 64 + 0x20, 0x100);
  }
  return bytes;
}

TEST_CASE("a fat-binary container is its header plus fat_size", "[server][image]") {
  auto bytes = fatbin(100, 116);
  auto sut = image_extent(bytes);
  REQUIRE(sut);
  CHECK(sut->format == ImageFormat::kFatbin);
  CHECK(sut->bytes == 116);
}

TEST_CASE("a container claiming more than was sent says so", "[server][image]") {
  auto bytes = fatbin(1 << 20, 116);
  auto sut = image_extent(bytes);
  REQUIRE(sut);
  CHECK(sut->bytes > bytes.size());
}

TEST_CASE("a container whose size wraps is refused", "[server][image]") {
  auto bytes = fatbin(~std::uint64_t{0} - 4, 32);
  CHECK_FALSE(image_extent(bytes));
}

TEST_CASE("a cut-short container header is refused", "[server][image]") {
  auto bytes = fatbin(0, 16);
  bytes.resize(8);
  CHECK_FALSE(image_extent(bytes));
}

TEST_CASE("an ELF ends after its section table or its furthest section", "[server][image]") {
  auto bytes = elf(3);
  auto sut = image_extent(bytes);
  REQUIRE(sut);
  CHECK(sut->format == ImageFormat::kElf);
  CHECK(sut->bytes == bytes.size());
}

TEST_CASE("an ELF whose section table lies past the end is longer than sent", "[server][image]") {
  auto bytes = elf(3);
  bytes.resize(bytes.size() - 64);
  auto sut = image_extent(bytes);
  REQUIRE(sut);
  CHECK(sut->bytes > bytes.size());
}

TEST_CASE("a 32-bit ELF is sized as the shim sizes it: one reading on both sides",
          "[server][image]") {
  // ELFCLASS32, little-endian; section headers (40 bytes) at 0x100, section 1 at 0x300 + 0x44.
  std::vector<std::byte> bytes(0x100 + 2 * 40);
  put<std::uint32_t>(bytes, 0, 0x464C457Fu);
  put<std::uint8_t>(bytes, 4, 1);
  put<std::uint8_t>(bytes, 5, 1);
  put<std::uint32_t>(bytes, 0x20, 0x100);        // e_shoff
  put<std::uint16_t>(bytes, 0x2E, 40);           // e_shentsize
  put<std::uint16_t>(bytes, 0x30, 2);            // e_shnum
  put<std::uint32_t>(bytes, 0x100 + 40 + 4, 1);  // PROGBITS
  put<std::uint32_t>(bytes, 0x100 + 40 + 16, 0x300);
  put<std::uint32_t>(bytes, 0x100 + 40 + 20, 0x44);
  auto sut = image_extent(bytes);
  REQUIRE(sut);
  CHECK(sut->format == ImageFormat::kElf);
  CHECK(sut->bytes == 0x344);  // past what was sent: the server refuses it as cut short
  bytes.resize(0x344);
  CHECK(image_extent(bytes)->bytes == bytes.size());
  bytes[5] = std::byte{2};  // big-endian: not a CUDA image
  CHECK_FALSE(image_extent(bytes));
}

TEST_CASE("PTX text ends at its terminator", "[server][image]") {
  std::string ptx = ".version 8.0\n.target sm_90\n";
  std::vector<std::byte> bytes(ptx.size() + 10);
  std::memcpy(bytes.data(), ptx.c_str(), ptx.size() + 1);
  auto sut = image_extent(bytes);
  REQUIRE(sut);
  CHECK(sut->format == ImageFormat::kText);
  CHECK(sut->bytes == ptx.size() + 1);
}

TEST_CASE("text without a terminator and wrappers are refused", "[server][image]") {
  std::vector<std::byte> text(64, std::byte{'a'});
  CHECK_FALSE(image_extent(text));
  std::vector<std::byte> wrapper(24);
  put<std::uint32_t>(wrapper, 0, 0x466243B1u);
  CHECK_FALSE(image_extent(wrapper));
}

TEST_CASE("a device-linked image splits into its back-to-back containers", "[server][image]") {
  auto image = fatbin(32, 48);
  auto second = fatbin(100, 116);
  auto third = fatbin(0, 16);
  image.insert(image.end(), second.begin(), second.end());
  image.insert(image.end(), third.begin(), third.end());

  auto sut = split_containers(image, 3);

  REQUIRE(sut);
  REQUIRE(sut->size() == 3);
  CHECK((*sut)[0].data() == image.data());
  CHECK((*sut)[0].size() == 48);
  CHECK((*sut)[1].data() == image.data() + 48);
  CHECK((*sut)[1].size() == 116);
  CHECK((*sut)[2].size() == 16);
}

TEST_CASE("a device-linked image must be exactly the containers it claims", "[server][image]") {
  auto image = fatbin(32, 48);
  auto second = fatbin(100, 116);
  image.insert(image.end(), second.begin(), second.end());

  CHECK_FALSE(split_containers(image, 3));  // fewer containers than stated
  CHECK_FALSE(split_containers(image, 1));  // more than stated
  auto cut = image;
  cut.resize(cut.size() - 1);
  CHECK_FALSE(split_containers(cut, 2));  // the last container runs past the end
  auto with_text = image;
  const char ptx[] = ".version 8.0";
  for (char c : ptx) with_text.push_back(static_cast<std::byte>(c));
  CHECK_FALSE(split_containers(with_text, 3));  // only fat-binary containers belong
}

// Found by tests/fuzz/fuzz_ring_records: a container whose header_size and fat_size are both 0
// is 0 bytes long, so the split never advanced and collected empty containers until it had the
// count the client stated (ImageLoadReq::containers, up to 2^32 - 1): tens of GiB and minutes
// of the server's time for one record.
TEST_CASE("an empty container is refused, whatever the count claimed", "[server][image]") {
  auto empty = fatbin(0, 16);
  put<std::uint16_t>(empty, 6, 0);  // header_size 0

  CHECK_FALSE(split_containers(empty, 0xFFFFFFFFu));
  auto image = fatbin(32, 48);
  image.insert(image.end(), empty.begin(), empty.end());
  CHECK_FALSE(split_containers(image, 0xFFFFFFFFu));
}

}  // namespace
}  // namespace mpsshim::server

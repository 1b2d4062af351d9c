#include "broker/server/images/image.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace mpsshim::server {
namespace {

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr std::uint32_t kElfMagic = 0x464C457Fu;  // "\x7fELF"
constexpr std::uint8_t kElfClass64 = 2;
constexpr std::uint32_t kShtNobits = 8;
constexpr std::size_t kElf64HeaderBytes = 64;
constexpr std::size_t kElf64SectionBytes = 64;

template <typename T>
bool read_at(std::span<const std::byte> bytes, std::uint64_t offset, T& out) {
  if (offset > bytes.size() || sizeof(T) > bytes.size() - offset) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(T));
  return true;
}

// a * b + c, or nullopt on overflow.
std::optional<std::uint64_t> mul_add(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  if (a != 0 && b > kMax / a) return std::nullopt;
  if (a * b > kMax - c) return std::nullopt;
  return a * b + c;
}

std::optional<std::uint64_t> elf64_extent(std::span<const std::byte> image) {
  std::uint64_t phoff = 0, shoff = 0;
  std::uint16_t phentsize = 0, phnum = 0, shentsize = 0, shnum16 = 0;
  if (!read_at(image, 0x20, phoff) || !read_at(image, 0x28, shoff) ||
      !read_at(image, 0x36, phentsize) || !read_at(image, 0x38, phnum) ||
      !read_at(image, 0x3A, shentsize) || !read_at(image, 0x3C, shnum16)) {
    return std::nullopt;
  }
  std::uint64_t shnum = shnum16;
  if (shnum != 0 || shoff != 0) {
    if (shentsize < kElf64SectionBytes) return std::nullopt;
  }
  if (shnum == 0 && shoff != 0) {  // extended numbering: the count is section 0's sh_size
    if (!read_at(image, shoff + 0x20, shnum)) return std::nullopt;
  }
  auto sections_end = mul_add(shnum, shentsize, shoff);
  auto program_end = mul_add(phnum, phentsize, phoff);
  if (!sections_end || !program_end) return std::nullopt;
  std::uint64_t end = std::max<std::uint64_t>({kElf64HeaderBytes, *sections_end, *program_end});
  if (*sections_end > image.size()) return end;  // longer than what was sent: caller refuses
  for (std::uint64_t i = 0; i < shnum; ++i) {
    std::uint64_t at = shoff + i * shentsize;
    std::uint32_t type = 0;
    std::uint64_t offset = 0, size = 0;
    if (!read_at(image, at + 0x04, type) || !read_at(image, at + 0x18, offset) ||
        !read_at(image, at + 0x20, size)) {
      return std::nullopt;
    }
    if (type == kShtNobits) continue;
    auto section_end = mul_add(1, offset, size);
    if (!section_end) return std::nullopt;
    end = std::max(end, *section_end);
  }
  return end;
}

}  // namespace

std::optional<ImageExtent> image_extent(std::span<const std::byte> image) {
  std::uint32_t magic = 0;
  if (read_at(image, 0, magic)) {
    if (magic == kFatbinMagic) {
      std::uint16_t header_size = 0;
      std::uint64_t fat_size = 0;
      if (!read_at(image, 6, header_size) || !read_at(image, 8, fat_size)) return std::nullopt;
      auto total = mul_add(1, fat_size, header_size);
      if (!total) return std::nullopt;
      return ImageExtent{ImageFormat::kFatbin, *total};
    }
    if (magic == kWrapperMagic) return std::nullopt;
    if (magic == kElfMagic) {
      std::uint8_t elf_class = 0;
      if (!read_at(image, 4, elf_class) || elf_class != kElfClass64) return std::nullopt;
      auto end = elf64_extent(image);
      if (!end) return std::nullopt;
      return ImageExtent{ImageFormat::kElf, *end};
    }
  }
  auto nul = std::find(image.begin(), image.end(), std::byte{0});
  if (nul == image.end()) return std::nullopt;
  return ImageExtent{ImageFormat::kText, static_cast<std::uint64_t>(nul - image.begin()) + 1};
}

std::optional<std::vector<std::span<const std::byte>>> split_containers(
    std::span<const std::byte> image, std::uint32_t count) {
  std::vector<std::span<const std::byte>> containers;
  std::uint64_t at = 0;
  while (at < image.size()) {
    if (containers.size() == count) return std::nullopt;  // bytes beyond the stated count
    auto rest = image.subspan(at);
    auto extent = image_extent(rest);
    // An empty container (header_size and fat_size 0) would not advance: the client's count,
    // up to 2^32, of empty spans.
    if (!extent || extent->format != ImageFormat::kFatbin || extent->bytes == 0 ||
        extent->bytes > rest.size()) {
      return std::nullopt;
    }
    containers.push_back(rest.first(extent->bytes));
    at += extent->bytes;
  }
  if (containers.size() != count) return std::nullopt;
  return containers;
}

}  // namespace mpsshim::server

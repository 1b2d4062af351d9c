#include "proto/image_extent.hpp"

#include <algorithm>
#include <cstring>

namespace mpsshim::proto {
namespace {

constexpr std::uint16_t kContainerVersion = 1;
constexpr std::uint16_t kMinContainerHeader = 16;
constexpr std::uint16_t kMaxContainerHeader = 4096;  // real ones are 16 bytes
constexpr std::uint32_t kShtNobits = 8;
constexpr std::uint32_t kPnXnum = 0xFFFF;  // e_phnum escape: the count is section 0's sh_info

template <typename T>
bool read_at(std::span<const std::byte> bytes, std::uint64_t offset, T& out) noexcept {
  if (offset > bytes.size() || sizeof(T) > bytes.size() - offset) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(T));
  return true;
}

// end = max(end, offset + size), refusing extents past kMaxImageBytes (also guards overflow).
bool extend(std::uint64_t& end, std::uint64_t offset, std::uint64_t size) noexcept {
  if (offset > kMaxImageBytes || size > kMaxImageBytes - offset) return false;
  end = std::max(end, offset + size);
  return true;
}

// Field offsets of the two ELF classes; the algorithm is the same.
struct ElfLayout {
  std::uint64_t ehdr_size;
  std::uint64_t e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum;
  std::uint64_t shdr_size, sh_type, sh_offset, sh_size, sh_info;
  std::uint64_t phdr_size, p_offset, p_filesz;
  bool wide;  // 64-bit offsets and sizes
};
constexpr ElfLayout kElf32{52, 0x1C, 0x20, 0x2A, 0x2C, 0x2E, 0x30, 40,
                           4,  16,   20,   28,   32,   4,    16,   false};
constexpr ElfLayout kElf64{64, 0x20, 0x28, 0x36, 0x38, 0x3A, 0x3C, 64,
                           4,  24,   32,   44,   56,   8,    32,   true};

bool read_word(std::span<const std::byte> image, std::uint64_t offset, bool wide,
               std::uint64_t& out) noexcept {
  if (wide) return read_at(image, offset, out);
  std::uint32_t narrow = 0;
  if (!read_at(image, offset, narrow)) return false;
  out = narrow;
  return true;
}

std::optional<std::uint64_t> elf_layout_extent(std::span<const std::byte> image,
                                               const ElfLayout& l) noexcept {
  if (image.size() < l.ehdr_size) return std::nullopt;
  std::uint64_t phoff = 0, shoff = 0;
  std::uint16_t phentsize = 0, shentsize = 0, phnum16 = 0, shnum16 = 0;
  if (!read_word(image, l.e_phoff, l.wide, phoff) || !read_word(image, l.e_shoff, l.wide, shoff) ||
      !read_at(image, l.e_phentsize, phentsize) || !read_at(image, l.e_shentsize, shentsize) ||
      !read_at(image, l.e_phnum, phnum16) || !read_at(image, l.e_shnum, shnum16)) {
    return std::nullopt;
  }
  std::uint64_t phnum = phnum16, shnum = shnum16;
  std::uint64_t end = l.ehdr_size;
  if (shoff != 0) {
    // Reading section headers needs their fields inside each entry; a smaller stride is garbage.
    if (shentsize < l.shdr_size || !extend(end, shoff, shentsize)) return std::nullopt;
    // Extended numbering: with >= SHN_LORESERVE sections e_shnum is 0 and the count is section
    // 0's sh_size (likewise e_phnum == PN_XNUM defers to its sh_info).
    if (shnum == 0 && !read_word(image, shoff + l.sh_size, l.wide, shnum)) return end;
    if (phnum == kPnXnum) {
      std::uint32_t count = 0;
      if (!read_at(image, shoff + l.sh_info, count)) return end;
      phnum = count;
    }
  } else {
    shnum = 0;
  }
  if (shnum > kMaxImageBytes / l.shdr_size || !extend(end, shoff, shnum * shentsize)) {
    return std::nullopt;
  }
  if (phnum != 0) {
    if (phoff == 0 || phentsize < l.phdr_size) return std::nullopt;
    // Triton cubins put the program headers after the section headers: count them too.
    if (phnum > kMaxImageBytes / l.phdr_size || !extend(end, phoff, phnum * phentsize)) {
      return std::nullopt;
    }
  }
  // Tables past what was sent: the image is longer than that, whatever the entries say.
  if (end > image.size()) return end;
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::uint64_t sh = shoff + i * shentsize;
    std::uint32_t type = 0;
    std::uint64_t offset = 0, size = 0;
    if (!read_at(image, sh + l.sh_type, type) ||
        !read_word(image, sh + l.sh_offset, l.wide, offset) ||
        !read_word(image, sh + l.sh_size, l.wide, size)) {
      return std::nullopt;
    }
    if (type == kShtNobits) continue;
    if (!extend(end, offset, size)) return std::nullopt;
  }
  // Segments normally lie inside sections; one that does not is still part of the file.
  for (std::uint64_t i = 0; i < phnum; ++i) {
    const std::uint64_t ph = phoff + i * phentsize;
    std::uint64_t offset = 0, size = 0;
    if (!read_word(image, ph + l.p_offset, l.wide, offset) ||
        !read_word(image, ph + l.p_filesz, l.wide, size) || !extend(end, offset, size)) {
      return std::nullopt;
    }
  }
  return end;
}

}  // namespace

std::optional<std::uint64_t> fatbin_container_extent(std::span<const std::byte> image) noexcept {
  std::uint32_t magic = 0;
  std::uint16_t version = 0, header_size = 0;
  std::uint64_t fat_size = 0;
  if (!read_at(image, 0, magic) || magic != kFatbinContainerMagic || !read_at(image, 4, version) ||
      !read_at(image, 6, header_size) || !read_at(image, 8, fat_size)) {
    return std::nullopt;
  }
  if (version != kContainerVersion || header_size < kMinContainerHeader ||
      header_size > kMaxContainerHeader) {
    return std::nullopt;
  }
  std::uint64_t end = 0;
  if (!extend(end, header_size, fat_size)) return std::nullopt;
  return end;
}

std::optional<std::uint64_t> elf_extent(std::span<const std::byte> image) noexcept {
  std::uint32_t magic = 0;
  std::uint8_t elf_class = 0, data = 0;
  if (!read_at(image, 0, magic) || magic != kElfMagic || !read_at(image, 4, elf_class) ||
      !read_at(image, 5, data)) {
    return std::nullopt;
  }
  constexpr std::uint8_t kClass32 = 1, kClass64 = 2, kLittleEndian = 1;
  // Cubins are little-endian like their host; a big-endian ELF is not a CUDA image.
  if (data != kLittleEndian) return std::nullopt;
  if (elf_class == kClass32) return elf_layout_extent(image, kElf32);
  if (elf_class == kClass64) return elf_layout_extent(image, kElf64);
  return std::nullopt;
}

std::optional<ImageExtent> image_extent(std::span<const std::byte> image) noexcept {
  std::uint32_t magic = 0;
  if (read_at(image, 0, magic)) {
    switch (magic) {
      case kFatbinContainerMagic:
        if (auto bytes = fatbin_container_extent(image))
          return ImageExtent{ImageFormat::kFatbin, *bytes};
        return std::nullopt;
      case kElfMagic:
        if (auto bytes = elf_extent(image)) return ImageExtent{ImageFormat::kElf, *bytes};
        return std::nullopt;
      case kFatbinWrapperMagic:
        return std::nullopt;  // only cuLibraryLoadData unwraps one, into containers
      default:
        break;
    }
  }
  const auto limit = image.first(std::min<std::uint64_t>(image.size(), kMaxImageBytes));
  const auto nul = std::find(limit.begin(), limit.end(), std::byte{0});
  if (nul == limit.end()) return std::nullopt;
  return ImageExtent{ImageFormat::kText, static_cast<std::uint64_t>(nul - limit.begin()) + 1};
}

}  // namespace mpsshim::proto

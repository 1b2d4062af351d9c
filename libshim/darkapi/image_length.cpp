#include "libshim/darkapi/image_length.hpp"

#include <cstdint>
#include <cstring>

#include "libshim/darkapi/fatbin_format.hpp"

namespace mpsshim::shim {
namespace {

using fatbin::load;

// Largest container/ELF header the shim believes in; real ones are 16 and 52/64 bytes.
constexpr std::uint16_t kMaxContainerHeader = 4096;

// end = max(end, offset + size), refusing extents past kMaxImageBytes (also guards overflow).
bool extend(std::uint64_t& end, std::uint64_t offset, std::uint64_t size) noexcept {
  if (offset > kMaxImageBytes || size > kMaxImageBytes - offset) return false;
  if (offset + size > end) end = offset + size;
  return true;
}

// Field offsets of the two ELF classes; the algorithm is the same (docs/private-tables.md).
struct ElfLayout {
  std::size_t ehdr_size;
  std::size_t e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum;
  std::size_t shdr_size, sh_type, sh_offset, sh_size, sh_info;
  std::size_t phdr_size, p_offset, p_filesz;
  bool wide;  // 64-bit offsets and sizes
};
constexpr ElfLayout kElf32{52, 0x1C, 0x20, 0x2A, 0x2C, 0x2E, 0x30, 40,
                           4,  16,   20,   28,   32,   4,    16,   false};
constexpr ElfLayout kElf64{64, 0x20, 0x28, 0x36, 0x38, 0x3A, 0x3C, 64,
                           4,  24,   32,   44,   56,   8,    32,   true};

std::uint64_t load_word(const void* base, std::uint64_t offset, bool wide) noexcept {
  return wide ? load<std::uint64_t>(base, offset) : load<std::uint32_t>(base, offset);
}

constexpr std::uint32_t kShtNobits = 8;
constexpr std::uint32_t kPnXnum = 0xFFFF;  // e_phnum escape: the count is in section 0's sh_info

std::optional<std::size_t> elf_extent(const std::byte* image, const ElfLayout& l) noexcept {
  const std::uint64_t phoff = load_word(image, l.e_phoff, l.wide);
  const std::uint64_t shoff = load_word(image, l.e_shoff, l.wide);
  const std::uint16_t phentsize = load<std::uint16_t>(image, l.e_phentsize);
  const std::uint16_t shentsize = load<std::uint16_t>(image, l.e_shentsize);
  std::uint64_t phnum = load<std::uint16_t>(image, l.e_phnum);
  std::uint64_t shnum = load<std::uint16_t>(image, l.e_shnum);

  std::uint64_t end = l.ehdr_size;
  if (shoff != 0) {
    // Reading section headers needs their fields inside each entry; a smaller stride is garbage.
    if (shentsize < l.shdr_size || !extend(end, shoff, shentsize)) return std::nullopt;
    // Extended numbering: with >= SHN_LORESERVE sections, e_shnum is 0 and the real count sits
    // in section 0's sh_size (likewise e_phnum == PN_XNUM defers to its sh_info).
    if (shnum == 0) shnum = load_word(image, shoff + l.sh_size, l.wide);
    if (phnum == kPnXnum) phnum = load<std::uint32_t>(image, shoff + l.sh_info);
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
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::uint64_t sh = shoff + i * shentsize;
    if (load<std::uint32_t>(image, sh + l.sh_type) == kShtNobits) continue;
    if (!extend(end, load_word(image, sh + l.sh_offset, l.wide),
                load_word(image, sh + l.sh_size, l.wide))) {
      return std::nullopt;
    }
  }
  // Segments normally lie inside sections; one that does not is still part of the file.
  for (std::uint64_t i = 0; i < phnum; ++i) {
    const std::uint64_t ph = phoff + i * phentsize;
    if (!extend(end, load_word(image, ph + l.p_offset, l.wide),
                load_word(image, ph + l.p_filesz, l.wide))) {
      return std::nullopt;
    }
  }
  return static_cast<std::size_t>(end);
}

std::optional<std::span<const std::byte>> container_piece(const void* container) noexcept {
  const auto length = fatbin_container_length(container);
  if (!length) return std::nullopt;
  return std::span(static_cast<const std::byte*>(container), *length);
}

bool wrapper_pieces(const fatbin::Wrapper& w, std::vector<std::span<const std::byte>>& out) {
  if (w.version != fatbin::kWrapperVersionPlain && w.version != fatbin::kWrapperVersionLinked) {
    return false;
  }
  const auto linked = container_piece(w.data);
  if (!linked) return false;
  out.push_back(*linked);
  if (w.version == fatbin::kWrapperVersionPlain) return true;

  // v2: ship the device-linked container and every prelinked one; the loader on the far side
  // decides which it uses, exactly as the real driver does with the same wrapper.
  const auto* list = static_cast<const void* const*>(w.filename_or_fatbins);
  if (list == nullptr || list[0] == nullptr) return false;
  for (std::size_t i = 0; list[i] != nullptr; ++i) {
    if (i == kMaxPrelinkedFatbins) return false;
    const auto piece = container_piece(list[i]);
    if (!piece) return false;
    out.push_back(*piece);
  }
  return true;
}

}  // namespace

std::optional<std::size_t> fatbin_container_length(const void* image) noexcept {
  // The magic first: anything else may be shorter than a container header.
  if (image == nullptr || fatbin::magic_of(image) != fatbin::kContainerMagic) return std::nullopt;
  const auto h = load<fatbin::ContainerHeader>(image, 0);
  if (h.version != fatbin::kContainerVersion || h.header_size < sizeof(fatbin::ContainerHeader) ||
      h.header_size > kMaxContainerHeader) {
    return std::nullopt;
  }
  std::uint64_t end = 0;
  if (!extend(end, h.header_size, h.fat_size)) return std::nullopt;
  return static_cast<std::size_t>(end);
}

std::optional<std::size_t> elf_image_length(const void* image) noexcept {
  if (image == nullptr || fatbin::magic_of(image) != fatbin::kElfMagic) return std::nullopt;
  const auto* bytes = static_cast<const std::byte*>(image);
  constexpr std::size_t kEiClass = 4, kEiData = 5;
  constexpr std::uint8_t kClass32 = 1, kClass64 = 2, kLittleEndian = 1;
  // Cubins are little-endian like their host; a big-endian ELF is not a CUDA image.
  if (load<std::uint8_t>(bytes, kEiData) != kLittleEndian) return std::nullopt;
  switch (load<std::uint8_t>(bytes, kEiClass)) {
    case kClass32:
      return elf_extent(bytes, kElf32);
    case kClass64:
      return elf_extent(bytes, kElf64);
    default:
      return std::nullopt;
  }
}

std::optional<std::size_t> module_image_length(const void* image) noexcept {
  if (image == nullptr) return std::nullopt;
  // A text shorter than a magic number may end right before unmapped memory: find its NUL
  // before reading four bytes. No binary magic contains a zero byte.
  const auto* chars = static_cast<const char*>(image);
  std::size_t prefix = 0;
  while (prefix < sizeof(std::uint32_t) && chars[prefix] != '\0') ++prefix;
  if (prefix < sizeof(std::uint32_t)) return prefix + 1;
  switch (fatbin::magic_of(image)) {
    case fatbin::kContainerMagic:
      return fatbin_container_length(image);
    case fatbin::kElfMagic:
      return elf_image_length(image);
    case fatbin::kWrapperMagic:
      return std::nullopt;  // only cuLibraryLoadData unwraps (library_image_pieces)
    default:
      break;
  }
  const std::size_t length = std::strlen(chars) + 1;
  if (length > kMaxImageBytes) return std::nullopt;
  return length;
}

bool library_image_pieces(const void* image,
                          std::vector<std::span<const std::byte>>& out) noexcept {
  out.clear();
  if (image == nullptr) return false;
  try {
    bool ok = false;
    if (fatbin::magic_of(image) == fatbin::kWrapperMagic) {
      ok = wrapper_pieces(load<fatbin::Wrapper>(image, 0), out);
    } else if (const auto length = module_image_length(image)) {
      out.emplace_back(static_cast<const std::byte*>(image), *length);
      ok = true;
    }
    if (!ok) out.clear();
    return ok;
  } catch (...) {  // allocation failure: nothing may escape a noexcept entry
    out.clear();
    return false;
  }
}

}  // namespace mpsshim::shim

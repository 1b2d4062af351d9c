// How long a module or library image is, read from its own headers: one fat-binary container
// (0xBA55ED50), an ELF cubin (32 or 64 bit), or NUL-terminated text (PTX). The shim sizes the
// images a client hands cuModuleLoadData and cuLibraryLoadData with it before shipping them;
// the server checks with it that what arrived is whole before the driver reads it. One reading
// on both sides, so that an image one side accepts the other does not refuse
// (docs/private-tables.md, "Fat binaries").
//
// Every read stays inside `image`. A table or section the headers place past its end makes the
// extent longer than `image.size()` (the server refuses such an image as cut short); the shim
// passes a span of kMaxImageBytes over client memory, so it reads only what the headers say
// exists. Claims beyond kMaxImageBytes, overflowing sums and implausible headers give nullopt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace mpsshim::proto {

inline constexpr std::uint64_t kMaxImageBytes = std::uint64_t{4} << 30;
inline constexpr std::uint32_t kFatbinContainerMagic = 0xBA55ED50u;
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;  // a pointer structure
inline constexpr std::uint32_t kElfMagic = 0x464C457Fu;            // "\x7fELF", little-endian

enum class ImageFormat { kFatbin, kElf, kText };

struct ImageExtent {
  ImageFormat format;
  std::uint64_t bytes;
};

// The image's extent; nullopt for a cut-short header, a fat-binary wrapper (not an image), text
// without a terminator inside `image`, or headers that fail the checks above.
std::optional<ImageExtent> image_extent(std::span<const std::byte> image) noexcept;

// The two structured forms alone; nullopt when `image` is not one or fails the checks. A
// container is header_size + fat_size bytes (version 1, a header of 16 to 4096 bytes). An ELF
// ends at the furthest of its header, section and program header tables, sections (not
// SHT_NOBITS) and segments, with extended section numbering and PN_XNUM.
std::optional<std::uint64_t> fatbin_container_extent(std::span<const std::byte> image) noexcept;
std::optional<std::uint64_t> elf_extent(std::span<const std::byte> image) noexcept;

}  // namespace mpsshim::proto

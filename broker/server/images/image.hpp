// The length a module or library image says it has, read from its own bytes, so the server
// can check that the driver will not read past what the client sent. Formats: one fat-binary
// container (0xBA55ED50), an ELF cubin, or NUL-terminated PTX text. See
// docs/private-tables.md, "Fat binaries".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace mpsshim::server {

enum class ImageFormat { kFatbin, kElf, kText };

struct ImageExtent {
  ImageFormat format;
  std::uint64_t bytes;
};

// nullopt when the bytes do not tell: a header cut short, an offset past the end, text with
// no terminator, a fat-binary wrapper (a pointer structure, not an image) or an unknown form.
std::optional<ImageExtent> image_extent(std::span<const std::byte> image);

// A device-linked (-rdc) program's image as the shim ships it: `count` fat-binary containers
// back to back, the device-linked one first, then each translation unit's prelinked one.
// nullopt unless the bytes are exactly that many whole containers.
std::optional<std::vector<std::span<const std::byte>>> split_containers(
    std::span<const std::byte> image, std::uint32_t count);

// The 24-byte __fatBinC_Wrapper_t of a device-linked program (version 2; docs/private-tables.md,
// "The wrapper") over containers split_containers found; `prelinked` is NULL-terminated and must
// outlive the load.
struct LinkedWrapper {
  std::uint32_t magic;
  std::uint32_t version;
  const void* data;
  const void* const* prelinked;
};
static_assert(sizeof(LinkedWrapper) == 24);
inline constexpr std::uint32_t kWrapperMagic = 0x466243B1u;
inline constexpr std::uint32_t kWrapperVersionLinked = 2;

}  // namespace mpsshim::server

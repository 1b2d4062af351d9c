// The length a module or library image says it has, read from its own bytes, so the server
// can check that the driver will not read past what the client sent. Formats: one fat-binary
// container (0xBA55ED50), an ELF cubin, or NUL-terminated PTX text. See dark-api.md §5.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace mpsshim::server {

enum class ImageFormat { kFatbin, kElf, kText };

struct ImageExtent {
  ImageFormat format;
  std::uint64_t bytes;
};

// nullopt when the bytes do not tell: a header cut short, an offset past the end, text with
// no terminator, a fat-binary wrapper (a pointer structure, not an image) or an unknown form.
std::optional<ImageExtent> image_extent(std::span<const std::byte> image);

}  // namespace mpsshim::server

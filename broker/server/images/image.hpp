// The images a client ships: their length (proto/image_extent.hpp, shared with the shim), so the
// server can check that the driver will not read past what the client sent, and a device-linked
// program's containers. See docs/private-tables.md, "Fat binaries".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "proto/image_extent.hpp"

namespace mpsshim::server {

// One reading of an image's length for the shim and the server (proto/image_extent.hpp).
using proto::image_extent;
using proto::ImageExtent;
using proto::ImageFormat;

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
inline constexpr std::uint32_t kWrapperMagic = proto::kFatbinWrapperMagic;
inline constexpr std::uint32_t kWrapperVersionLinked = 2;

}  // namespace mpsshim::server

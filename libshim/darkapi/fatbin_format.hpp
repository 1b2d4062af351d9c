// On-memory layouts of CUDA fat binaries (docs/private-tables.md, "Fat binaries"): the
// __fatBinC_Wrapper_t that nvcc emits into .nvFatBinSegment and the fatbin container it points at.
// Only what sizing and unwrapping an image needs; entries inside a container are never parsed by
// the shim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "proto/image_extent.hpp"

namespace mpsshim::shim::fatbin {

inline constexpr std::uint32_t kWrapperMagic = proto::kFatbinWrapperMagic;  // FATBINC_MAGIC
inline constexpr std::uint32_t kWrapperVersionPlain = 1;                    // FATBINC_VERSION
inline constexpr std::uint32_t kWrapperVersionLinked = 2;  // FATBINC_LINK_VERSION (-rdc)
inline constexpr std::uint32_t kContainerMagic = proto::kFatbinContainerMagic;
inline constexpr std::uint32_t kElfMagic = proto::kElfMagic;  // "\x7fELF", read little-endian

// __fatBinC_Wrapper_t (fatbinary_section.h), with the fields' real meaning.
struct Wrapper {
  std::uint32_t magic;
  std::uint32_t version;
  const void* data;  // the fatbin container (v2: the device-linked one)
  // v1: offline file name, normally NULL. v2: NULL-terminated array of pointers to the
  // prelinked (relocatable) containers of each translation unit (__cudaPrelinkedFatbins).
  const void* filename_or_fatbins;
};
static_assert(sizeof(Wrapper) == 24);

// Container header: the container is header_size + fat_size bytes long (§5.2).
struct ContainerHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t header_size;
  std::uint64_t fat_size;
};
static_assert(sizeof(ContainerHeader) == 16);
inline constexpr std::uint16_t kContainerVersion = 1;

// Images come from arbitrary client memory: read fields without alignment assumptions.
template <class T>
T load(const void* base, std::size_t offset) noexcept {
  T value;
  std::memcpy(&value, static_cast<const std::byte*>(base) + offset, sizeof value);
  return value;
}

inline std::uint32_t magic_of(const void* image) noexcept {
  return load<std::uint32_t>(image, 0);
}

}  // namespace mpsshim::shim::fatbin

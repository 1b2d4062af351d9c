#include "libshim/darkapi/image_length.hpp"

#include <cstdint>

#include "libshim/darkapi/fatbin_format.hpp"
#include "proto/image_extent.hpp"

namespace mpsshim::shim {
namespace {

using fatbin::load;

// Client memory of unknown length: the span the shared reading may use. It reads only what the
// image's headers say exists, and refuses claims past kMaxImageBytes.
std::span<const std::byte> client_image(const void* image) noexcept {
  return {static_cast<const std::byte*>(image), static_cast<std::size_t>(kMaxImageBytes)};
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
  return proto::fatbin_container_extent(client_image(image));
}

std::optional<std::size_t> elf_image_length(const void* image) noexcept {
  if (image == nullptr || fatbin::magic_of(image) != fatbin::kElfMagic) return std::nullopt;
  return proto::elf_extent(client_image(image));
}

std::optional<std::size_t> module_image_length(const void* image) noexcept {
  if (image == nullptr) return std::nullopt;
  // A text shorter than a magic number may end right before unmapped memory: find its NUL
  // before reading four bytes. No binary magic contains a zero byte.
  const auto* chars = static_cast<const char*>(image);
  std::size_t prefix = 0;
  while (prefix < sizeof(std::uint32_t) && chars[prefix] != '\0') ++prefix;
  if (prefix < sizeof(std::uint32_t)) return prefix + 1;
  const auto extent = proto::image_extent(client_image(image));
  if (!extent) return std::nullopt;
  return static_cast<std::size_t>(extent->bytes);
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

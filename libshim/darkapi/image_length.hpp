// Byte length of a module image known only by its pointer (docs/private-tables.md), so that the
// shim can copy cuModuleLoadData / cuLibraryLoadData images to the broker before returning. The
// reading itself is proto/image_extent.hpp, the server's too.
// The image is client memory of unknown size: every function reads only bytes the format says
// exist, and refuses headers whose claims exceed sanity limits instead of walking off a cliff.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "proto/image_extent.hpp"

namespace mpsshim::shim {

// Largest image the shim will size: a header claiming more is treated as garbage.
inline constexpr std::size_t kMaxImageBytes = proto::kMaxImageBytes;

// cuModuleLoadData / cuModuleLoadDataEx / cuModuleLoadFatBinary:
//  * fatbin container: header_size + fat_size, exactly one container (never the next one);
//  * ELF (cubin), 32 or 64 bit: the furthest byte of the header, section and program header
//    tables, sections (except SHT_NOBITS) and segments, with extended section numbering;
//  * anything else is PTX (or other text): strlen + 1.
// nullopt for NULL, for a __fatBinC_Wrapper_t (the real cuModuleLoadData answers
// CUDA_ERROR_INVALID_IMAGE) and for headers that fail the sanity checks.
std::optional<std::size_t> module_image_length(const void* image) noexcept;

// The pieces cuLibraryLoadData must ship, in order, replacing `out`'s contents:
//  * a plain image (as above): one piece;
//  * a v1 wrapper: the container at data;
//  * a v2 wrapper: the container at data, then each container of the NULL-terminated
//    prelinked list (at most kMaxPrelinkedFatbins; a NULL or empty list is refused).
// False (and `out` empty) when the image is refused.
inline constexpr std::size_t kMaxPrelinkedFatbins = 4096;
bool library_image_pieces(const void* image, std::vector<std::span<const std::byte>>& out) noexcept;

// The two structured forms on their own; nullopt when `image` is not one or fails the checks.
std::optional<std::size_t> fatbin_container_length(const void* image) noexcept;
std::optional<std::size_t> elf_image_length(const void* image) noexcept;

}  // namespace mpsshim::shim

#include "broker/server/images/image.hpp"

namespace mpsshim::server {

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

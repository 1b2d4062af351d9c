#include "broker/daemon/visible_devices.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace mpsshim::daemon {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  if (prefix.size() > text.size()) return false;
  return std::equal(prefix.begin(), prefix.end(), text.begin(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  });
}

std::optional<int> by_index(std::string_view item, std::size_t count) {
  int value = -1;
  auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
  if (error != std::errc{} || end != item.data() + item.size()) return std::nullopt;
  if (value < 0 || static_cast<std::size_t>(value) >= count) return std::nullopt;
  return value;
}

// The one GPU whose formatted UUID starts with `item`; none when no or several GPUs match.
std::optional<int> by_uuid(std::string_view item, std::span<const std::optional<GpuUuid>> uuids) {
  constexpr std::string_view kPrefix = "GPU-";
  if (item.size() <= kPrefix.size()) return std::nullopt;
  std::optional<int> found;
  for (std::size_t i = 0; i < uuids.size(); ++i) {
    if (!uuids[i] || !starts_with_ignoring_case(format_gpu_uuid(*uuids[i]), item)) continue;
    if (found) return std::nullopt;  // ambiguous
    found = static_cast<int>(i);
  }
  return found;
}

}  // namespace

std::string format_gpu_uuid(const GpuUuid& u) {
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
      u[15]);
}

std::string format_gpu_uuid(const std::uint8_t (&uuid)[16]) {
  GpuUuid copy;
  std::copy(std::begin(uuid), std::end(uuid), copy.begin());
  return format_gpu_uuid(copy);
}

std::vector<int> resolve_visible_devices(std::string_view spec,
                                         std::span<const std::optional<GpuUuid>> uuids) {
  std::vector<int> visible;
  if (trim(spec).empty()) {
    for (std::size_t i = 0; i < uuids.size(); ++i) visible.push_back(static_cast<int>(i));
    return visible;
  }
  while (true) {
    std::size_t comma = spec.find(',');
    std::string_view item = trim(spec.substr(0, comma));
    std::optional<int> ordinal = starts_with_ignoring_case(item, "GPU-")
                                     ? by_uuid(item, uuids)
                                     : by_index(item, uuids.size());
    if (!ordinal || std::find(visible.begin(), visible.end(), *ordinal) != visible.end()) break;
    visible.push_back(*ordinal);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return visible;
}

}  // namespace mpsshim::daemon

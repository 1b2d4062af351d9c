// Byte counts as operators write them: "4G", "512M", "1073741824" (binary units, as
// nvidia-cuda-mps-control's set_default_device_pinned_mem_limit takes them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mpsshim::daemon {

// Digits with an optional K, M, G or T (case-insensitive, optionally followed by "B" or "iB").
std::optional<std::uint64_t> parse_size(std::string_view text);

// The largest unit that says `bytes` exactly: 4294967296 -> "4G", 1536 -> "1536", 0 -> "0".
std::string format_size(std::uint64_t bytes);

// For people: 85520809984 -> "79.6 GiB".
std::string format_size_approx(std::uint64_t bytes);

}  // namespace mpsshim::daemon

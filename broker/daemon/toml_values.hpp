// Values of a TOML file read the same way by mpsshimd's --config (config_file.cpp) and the
// Kubernetes device plugin's config (deviceplugin/config.cpp): absent is nullopt, a wrong value
// is the sentence the file is refused with ("KEY: expected ...").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <toml++/toml.h>
#include <tl/expected.hpp>

namespace mpsshim::daemon {

// A size: "20G" (parse_size) or a number of bytes.
tl::expected<std::optional<std::uint64_t>, std::string> toml_size(const toml::node* node,
                                                                  std::string_view key);

// A whole number from `low` to `high`.
tl::expected<std::optional<int>, std::string> toml_int(const toml::node* node, std::string_view key,
                                                       int low, int high);

}  // namespace mpsshim::daemon

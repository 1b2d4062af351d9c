#include "broker/daemon/toml_values.hpp"

#include <fmt/format.h>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

tl::expected<std::optional<std::uint64_t>, std::string> toml_size(const toml::node* node,
                                                                  std::string_view key) {
  if (node == nullptr) return std::optional<std::uint64_t>{};
  if (auto bytes = node->value<std::int64_t>(); bytes && *bytes >= 0) {
    return std::optional<std::uint64_t>(static_cast<std::uint64_t>(*bytes));
  }
  if (auto text = node->value<std::string>()) {
    if (auto bytes = parse_size(*text)) return std::optional<std::uint64_t>(*bytes);
  }
  return tl::unexpected(
      fmt::format("{}: expected a size such as \"20G\" or a number of bytes", key));
}

tl::expected<std::optional<int>, std::string> toml_int(const toml::node* node, std::string_view key,
                                                       int low, int high) {
  if (node == nullptr) return std::optional<int>{};
  auto value = node->value<std::int64_t>();
  if (!value || *value < low || *value > high) {
    return tl::unexpected(fmt::format("{}: expected a whole number from {} to {}", key, low, high));
  }
  return std::optional<int>(static_cast<int>(*value));
}

}  // namespace mpsshim::daemon

#include "broker/server/accounting/client_limits.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>

namespace mpsshim::server {
namespace {

// Pinned pages cannot be swapped or reclaimed: one client pinning all of the host's memory
// would take it from every other process. Half leaves the rest to them.
std::uint64_t half_of_host_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}

}  // namespace

ClientLimits::ClientLimits() {
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = kClientLimitSpecs[i].default_value;
  set(ClientLimit::kPinnedBytes, half_of_host_memory());
}

std::optional<ClientLimit> find_client_limit(std::string_view name) {
  for (std::size_t i = 0; i < kClientLimitSpecs.size(); ++i) {
    if (name == kClientLimitSpecs[i].name) return static_cast<ClientLimit>(i);
  }
  return std::nullopt;
}

std::string client_limit_names() {
  std::string names;
  for (const ClientLimitSpec& spec : kClientLimitSpecs) {
    if (!names.empty()) names += ", ";
    names += spec.name;
  }
  return names;
}

std::optional<std::string> parse_client_limit(std::string_view text, ClientLimits& limits) {
  const std::size_t equals = text.find('=');
  if (equals == std::string_view::npos) {
    return fmt::format("--client-limit {}: expected NAME=VALUE, NAME one of {}", text,
                       client_limit_names());
  }
  auto limit = find_client_limit(text.substr(0, equals));
  if (!limit) {
    return fmt::format("--client-limit {}: unknown limit `{}`; the limits are {}", text,
                       text.substr(0, equals), client_limit_names());
  }
  std::string_view value = text.substr(equals + 1);
  std::uint64_t number = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (value.empty() || error != std::errc{} || end != value.data() + value.size()) {
    return fmt::format("--client-limit {}: expected a whole number{} (0: no limit)", text,
                       spec_of(*limit).bytes ? " of bytes" : "");
  }
  limits.set(*limit, number);
  return std::nullopt;
}

}  // namespace mpsshim::server

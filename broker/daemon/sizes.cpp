#include "broker/daemon/sizes.hpp"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <charconv>

namespace mpsshim::daemon {

namespace {

struct Unit {
  char letter;
  int shift;
};
constexpr std::array<Unit, 4> kUnits{{{'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}}};

}  // namespace

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::uint64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end == text.data()) return std::nullopt;
  std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  if (suffix.empty()) return value;
  char letter = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix.front())));
  suffix.remove_prefix(1);
  if (!(suffix.empty() || suffix == "B" || suffix == "b" || suffix == "iB" || suffix == "ib")) {
    return std::nullopt;
  }
  if (letter == 'B' && suffix.empty()) return value;
  for (const Unit& unit : kUnits) {
    if (unit.letter != letter) continue;
    if (value > (UINT64_MAX >> unit.shift)) return std::nullopt;
    return value << unit.shift;
  }
  return std::nullopt;
}

std::string format_size(std::uint64_t bytes) {
  for (const Unit& unit : kUnits) {
    std::uint64_t mask = (std::uint64_t{1} << unit.shift) - 1;
    if (bytes != 0 && (bytes & mask) == 0)
      return fmt::format("{}{}", bytes >> unit.shift, unit.letter);
  }
  return fmt::format("{}", bytes);
}

std::string format_size_approx(std::uint64_t bytes) {
  constexpr std::array<std::string_view, 5> kNames{"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.1f} {}", value, kNames[unit]);
}

}  // namespace mpsshim::daemon

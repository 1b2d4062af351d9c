#include "broker/server/scheduling/sm_reserve_option.hpp"

#include <fmt/format.h>

#include <charconv>

namespace mpsshim::server {
namespace {

// Below-normal clients keep at least a tenth of the device.
constexpr unsigned kMaxPercent = 90;
// More SMs than any GPU has; the server clamps to the device's split anyway.
constexpr unsigned kMaxCount = 4096;

}  // namespace

tl::expected<SmReserveSpec, std::string> parse_sm_reserve(std::string_view text) {
  if (text == "off") return SmReserveSpec{};
  SmReserveSpec spec;
  std::string_view digits = text;
  if (!digits.empty() && digits.back() == '%') {
    spec.percent = true;
    digits.remove_suffix(1);
  }
  const char* end = digits.data() + digits.size();
  auto [at, ec] = std::from_chars(digits.data(), end, spec.amount);
  const unsigned most = spec.percent ? kMaxPercent : kMaxCount;
  if (digits.empty() || ec != std::errc{} || at != end || spec.amount > most) {
    return tl::unexpected(fmt::format(
        "--priority-reserve-sms {}: expected a number of SMs (0-{}), a percentage of the "
        "device's SMs (0%-{}%), or off",
        text, kMaxCount, kMaxPercent));
  }
  if (spec.amount == 0) spec.percent = false;
  return spec;
}

std::string format_sm_reserve(const SmReserveSpec& spec) {
  if (spec.amount == 0) return "0";
  return fmt::format("{}{}", spec.amount, spec.percent ? "%" : "");
}

}  // namespace mpsshim::server

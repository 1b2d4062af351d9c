// How many SMs a GPU's server keeps for normal-priority clients (mpsshimd and mpsshim-server
// --priority-reserve-sms N|P%): while one is connected, below-normal clients run in green
// contexts without them (priority_reserve.hpp). No CUDA here: the daemon includes this to check
// the value it passes on.
#pragma once

#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace mpsshim::server {

struct SmReserveSpec {
  unsigned amount = 0;   // 0: off
  bool percent = false;  // amount is a percentage of the device's SMs, else a count of SMs
  bool operator==(const SmReserveSpec&) const = default;
};

// The default: 18% of the SMs, which the server rounds up to whole groups of the split (H100:
// 23.8 -> 24 SMs, three groups of 8). Chosen by measurement (bench/harness.py --workloads
// priority, H100, docs/benchmarks.md): with 16 SMs the high-priority client's p99 beside four
// batch clients was 0.95-1.23x its p99 alone (the target is <= 1.1x), with 24 SMs
// 0.92-1.06x in three runs, with 32 SMs the batch clients fell to 0.76x of their throughput
// alone (the floor is 0.8x); with 24 they keep 0.82x.
inline constexpr SmReserveSpec kDefaultSmReserve{18, true};

// "16" (SMs), "10%" (of the device's SMs, 0-90%), "0" or "off" (none).
tl::expected<SmReserveSpec, std::string> parse_sm_reserve(std::string_view text);
// The spec as parse_sm_reserve reads it back.
std::string format_sm_reserve(const SmReserveSpec& spec);

}  // namespace mpsshim::server

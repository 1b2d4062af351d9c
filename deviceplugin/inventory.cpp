#include "deviceplugin/inventory.hpp"

#include <fmt/format.h>

#include <charconv>
#include <map>
#include <sstream>

namespace mpsshim::deviceplugin {

namespace {

constexpr std::string_view kReplicaSeparator = "::";

template <typename T>
std::optional<T> number(std::string_view text) {
  T value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

tl::expected<std::vector<GpuState>, std::string> parse_gpu_states(const std::string& text) {
  std::vector<GpuState> gpus;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    // The name takes the rest of the line: it may hold blanks.
    std::size_t name_at = line.find(" name=");
    std::map<std::string, std::string> fields;
    std::istringstream words(line.substr(0, name_at));
    for (std::string word; words >> word;) {
      std::size_t eq = word.find('=');
      if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
    GpuState gpu;
    auto index = number<int>(fields["gpu"]);
    if (!index || fields["state"].empty()) {
      return tl::unexpected(fmt::format("unexpected gpu_states line from mpsshimd: `{}`", line));
    }
    gpu.index = *index;
    gpu.state = fields["state"];
    gpu.uuid = fields["uuid"];
    gpu.memory = number<std::uint64_t>(fields["memory"]).value_or(0);
    gpu.name = name_at == std::string::npos ? "-" : line.substr(name_at + 6);
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

std::vector<Replica> replicas_of(const PluginConfig& config, const std::vector<GpuState>& gpus) {
  std::vector<Replica> replicas;
  for (const GpuState& gpu : gpus) {
    if (gpu.uuid.empty() || gpu.uuid == "-") continue;
    const GpuShare share = share_for(config, gpu.name, gpu.memory);
    for (int n = 0; n < share.replicas; ++n) {
      replicas.push_back(
          Replica{fmt::format("{}{}{}", gpu.uuid, kReplicaSeparator, n), gpu.index, gpu.healthy()});
    }
  }
  return replicas;
}

std::optional<int> replica_number(const std::string& device_id) {
  std::size_t separator = device_id.rfind(kReplicaSeparator);
  if (separator == std::string::npos) return std::nullopt;
  return number<int>(std::string_view(device_id).substr(separator + kReplicaSeparator.size()));
}

const GpuState* gpu_of_device(const std::vector<GpuState>& gpus, const std::string& device_id) {
  std::size_t separator = device_id.rfind(kReplicaSeparator);
  if (separator == std::string::npos) return nullptr;
  std::string_view uuid = std::string_view(device_id).substr(0, separator);
  for (const GpuState& gpu : gpus) {
    if (gpu.uuid == uuid) return &gpu;
  }
  return nullptr;
}

}  // namespace mpsshim::deviceplugin

#include "deviceplugin/config.hpp"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <fstream>
#include <sstream>

#include "broker/daemon/sizes.hpp"
#include "broker/daemon/toml_values.hpp"

namespace mpsshim::deviceplugin {

namespace {

constexpr int kMaxReplicas = 256;

using daemon::toml_int;
using daemon::toml_size;

tl::expected<void, std::string> read_rule(const toml::table& table, SharingRule& rule,
                                          std::string_view where) {
  auto replicas =
      toml_int(table.get("replicas"), fmt::format("{}replicas", where), 1, kMaxReplicas);
  if (!replicas) return tl::unexpected(replicas.error());
  if (*replicas) rule.replicas = **replicas;
  auto sm = toml_int(table.get("sm_percentage"), fmt::format("{}sm_percentage", where), 1, 100);
  if (!sm) return tl::unexpected(sm.error());
  if (*sm) rule.sm_percentage = *sm;
  auto memory = toml_size(table.get("memory_limit"), fmt::format("{}memory_limit", where));
  if (!memory) return tl::unexpected(memory.error());
  if (*memory) rule.memory_limit = *memory;
  return {};
}

tl::expected<void, std::string> read_string(const toml::table& table, std::string_view key,
                                            std::string& out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return {};
  auto value = node->value<std::string>();
  if (!value || value->empty()) {
    return tl::unexpected(fmt::format("{}: expected a non-empty string", key));
  }
  out = *value;
  return {};
}

}  // namespace

tl::expected<PluginConfig, std::string> parse_config(const std::string& toml_text) {
  toml::table table;
  try {
    table = toml::parse(toml_text);
  } catch (const toml::parse_error& error) {
    return tl::unexpected(
        fmt::format("line {}: {}", error.source().begin.line, std::string(error.description())));
  }
  static constexpr std::string_view kKnown[] = {"resource_name",
                                                "replicas",
                                                "sm_percentage",
                                                "memory_limit",
                                                "model",
                                                "plugin_dir",
                                                "endpoint",
                                                "runtime_dir",
                                                "shim_library",
                                                "container_runtime_dir",
                                                "container_shim_library",
                                                "health_interval_ms",
                                                "preload_libraries",
                                                "pod_resources_socket",
                                                "isolation"};
  for (const auto& [key, value] : table) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key.str()) == std::end(kKnown)) {
      return tl::unexpected(fmt::format("unknown key `{}`", key.str()));
    }
  }
  PluginConfig config;
  for (auto [key, field] :
       {std::pair<std::string_view, std::string*>{"resource_name", &config.resource_name},
        {"plugin_dir", &config.plugin_dir},
        {"endpoint", &config.endpoint},
        {"runtime_dir", &config.runtime_dir},
        {"container_runtime_dir", &config.container_runtime_dir},
        {"shim_library", &config.shim_library},
        {"container_shim_library", &config.container_shim_library},
        {"pod_resources_socket", &config.pod_resources_socket}}) {
    if (auto read = read_string(table, key, *field); !read) return tl::unexpected(read.error());
  }
  if (config.resource_name.find('/') == std::string::npos) {
    return tl::unexpected(
        fmt::format("resource_name `{}`: an extended resource needs a domain, as in mpsshim.io/gpu",
                    config.resource_name));
  }
  if (const toml::node* preload = table.get("preload_libraries")) {
    const toml::array* list = preload->as_array();
    if (list == nullptr) return tl::unexpected(std::string("preload_libraries: expected a list"));
    for (const toml::node& item : *list) {
      auto name = item.value<std::string>();
      if (!name || name->empty() || name->find('/') != std::string::npos) {
        return tl::unexpected(
            std::string("preload_libraries: expected file names in the shim library's directory"));
      }
      config.preload_libraries.push_back(*name);
    }
  }
  if (const toml::node* isolation = table.get("isolation")) {
    auto value = isolation->value<std::string>();
    if (!value || (*value != "shared" && *value != "allocation")) {
      return tl::unexpected(std::string("isolation: expected \"shared\" or \"allocation\""));
    }
    config.isolate_allocations = *value == "allocation";
  }
  auto interval = toml_int(table.get("health_interval_ms"), "health_interval_ms", 100, 600000);
  if (!interval) return tl::unexpected(interval.error());
  if (*interval) config.health_interval = std::chrono::milliseconds(**interval);
  if (auto read = read_rule(table, config.sharing, ""); !read) return tl::unexpected(read.error());
  if (const toml::node* models = table.get("model")) {
    const toml::array* list = models->as_array();
    if (list == nullptr) return tl::unexpected(std::string("model: expected [[model]] tables"));
    for (std::size_t i = 0; i < list->size(); ++i) {
      const toml::table* entry = list->get(i)->as_table();
      if (entry == nullptr) return tl::unexpected(fmt::format("model {}: not a table", i + 1));
      SharingRule rule = config.sharing;
      rule.match.clear();
      if (auto read = read_string(*entry, "match", rule.match); !read || rule.match.empty()) {
        return tl::unexpected(
            fmt::format("model {}: needs match = \"part of the GPU's name\"", i + 1));
      }
      // A model's replicas change the defaults derived from them, not values set at the top.
      rule.sm_percentage = config.sharing.sm_percentage;
      rule.memory_limit = config.sharing.memory_limit;
      if (entry->get("replicas") != nullptr) {
        rule.sm_percentage.reset();
        rule.memory_limit.reset();
      }
      auto read = read_rule(*entry, rule, fmt::format("model {} ({}): ", i + 1, rule.match));
      if (!read) return tl::unexpected(read.error());
      config.models.push_back(std::move(rule));
    }
  }
  return config;
}

tl::expected<PluginConfig, std::string> load_config(const std::string& path) {
  std::ifstream file(path);
  if (!file) return tl::unexpected(fmt::format("cannot read {}", path));
  std::stringstream text;
  text << file.rdbuf();
  auto config = parse_config(text.str());
  if (!config) return tl::unexpected(fmt::format("{}: {}", path, config.error()));
  return config;
}

GpuShare share_for(const PluginConfig& config, const std::string& gpu_name,
                   std::uint64_t gpu_memory) {
  const SharingRule* rule = &config.sharing;
  for (const SharingRule& model : config.models) {
    if (gpu_name.find(model.match) != std::string::npos) {
      rule = &model;
      break;
    }
  }
  GpuShare share;
  share.replicas = rule->replicas;
  // Rounded up, as the server rounds SM counts up: 3 replicas get 34% each, not 33%.
  share.sm_percentage = rule->sm_percentage.value_or((100 + rule->replicas - 1) / rule->replicas);
  share.memory_limit = rule->memory_limit.value_or(gpu_memory / rule->replicas);
  return share;
}

}  // namespace mpsshim::deviceplugin

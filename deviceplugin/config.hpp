// mpsshim-device-plugin's configuration: a TOML file (packaging/kubernetes/ puts it in a
// ConfigMap). Every key is optional; docs/kubernetes.md lists them.
//
//   resource_name = "mpsshim.io/gpu"
//   replicas = 4                    # devices advertised per GPU
//   sm_percentage = 25              # per replica; default ceil(100 / replicas)
//   memory_limit = "20G"            # per replica; default the GPU's memory / replicas
//   [[model]]                       # overrides for GPUs whose name contains `match`
//   match = "H100"
//   replicas = 7
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tl/expected.hpp>

namespace mpsshim::deviceplugin {

// How one GPU is shared: the first [[model]] whose `match` is part of the GPU's name, else
// the file's top-level values.
struct SharingRule {
  std::string match;  // empty: the top-level rule
  int replicas = 4;
  std::optional<int> sm_percentage;           // per replica
  std::optional<std::uint64_t> memory_limit;  // bytes per replica
};

struct PluginConfig {
  std::string resource_name = "mpsshim.io/gpu";
  SharingRule sharing;
  std::vector<SharingRule> models;
  // The kubelet's device-plugin directory (kubelet.sock is there; the plugin's socket goes
  // there too).
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  std::string endpoint = "mpsshim.sock";
  // mpsshimd's runtime directory on the node, and where containers see it.
  std::string runtime_dir = "/run/mpsshim";
  std::string container_runtime_dir = "/run/mpsshim";
  // libmpsshim.so on the node, and where containers see it (LD_PRELOAD names this one). Its
  // whole directory is mounted, so libraries it needs can lie beside it.
  std::string shim_library = "/usr/lib/mpsshim/libmpsshim.so";
  std::string container_shim_library = "/usr/lib/mpsshim/libmpsshim.so";
  // Libraries beside the shim that LD_PRELOAD names before it: what it needs that a pod's
  // image may lack (libfmt.so.9 with Debian 12's build).
  std::vector<std::string> preload_libraries;
  std::chrono::milliseconds health_interval{1000};
  // The kubelet's pod-resources API: which pod holds which device, for ps and the metrics.
  // Not there (or empty): allocations are not named.
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  // isolation = "allocation": every allocation asks mpsshimd for servers of its own
  // (register_allocation isolation=own), whatever mpsshimd --isolation says; "shared" (the
  // default) leaves placement to mpsshimd.
  bool isolate_allocations = false;
};

// What a GPU's replicas get, from the rule for its name.
struct GpuShare {
  int replicas = 1;
  int sm_percentage = 100;         // of one replica
  std::uint64_t memory_limit = 0;  // bytes of one replica; 0 = no limit
};

tl::expected<PluginConfig, std::string> parse_config(const std::string& toml_text);
tl::expected<PluginConfig, std::string> load_config(const std::string& path);

GpuShare share_for(const PluginConfig& config, const std::string& gpu_name,
                   std::uint64_t gpu_memory);

}  // namespace mpsshim::deviceplugin

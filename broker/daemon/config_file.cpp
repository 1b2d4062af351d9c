#include "broker/daemon/config_file.hpp"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <fstream>
#include <string_view>

#include "broker/daemon/options.hpp"
#include "broker/daemon/sizes.hpp"
#include "broker/daemon/toml_values.hpp"

namespace mpsshim::daemon {

namespace {

// Options that make no sense in a file: the file itself, and those that only print.
constexpr std::string_view kCommandLineOnly[] = {"config", "help", "version"};

std::string at(const std::string& path, const toml::node& node) {
  return fmt::format("{}:{}", path, node.source().begin.line);
}

// One option as command-line words: a string or a number is its value, true is the bare
// option (for those without a value), false leaves it out.
tl::expected<std::vector<std::string>, std::string> option_words(std::string_view key,
                                                                 const toml::node& value) {
  const std::string option = fmt::format("--{}", key);
  if (auto text = value.value_exact<std::string>()) return std::vector{option, *text};
  if (auto number = value.value_exact<std::int64_t>()) {
    return std::vector{option, std::to_string(*number)};
  }
  if (auto flag = value.value_exact<bool>()) {
    if (*flag) return std::vector{option};
    return std::vector<std::string>{};
  }
  if (const toml::array* list = value.as_array()) {  // a repeatable option (client-limit)
    std::vector<std::string> words;
    for (const toml::node& item : *list) {
      auto text = item.value_exact<std::string>();
      if (!text) return tl::unexpected(fmt::format("{}: expected a list of strings", key));
      words.insert(words.end(), {option, *text});
    }
    return words;
  }
  return tl::unexpected(fmt::format("{}: expected a string, a number or true/false", key));
}

// Checks words of one option with mpsshimd's own parser.
tl::expected<void, std::string> check_option(const std::vector<std::string>& words) {
  std::vector<std::string> argv{"mpsshimd"};
  argv.insert(argv.end(), words.begin(), words.end());
  std::vector<char*> pointers;
  for (std::string& word : argv) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  auto parsed = parse_daemon_options(static_cast<int>(argv.size()), pointers.data());
  if (!parsed) return tl::unexpected(parsed.error());
  return {};
}

template <typename T>
tl::expected<std::vector<T>, std::string> id_list(const toml::table& table, std::string_view key) {
  std::vector<T> ids;
  const toml::node* node = table.get(key);
  if (node == nullptr) return ids;
  const toml::array* list = node->as_array();
  if (list == nullptr) return tl::unexpected(fmt::format("{}: expected a list of numbers", key));
  for (const toml::node& item : *list) {
    auto id = item.value_exact<std::int64_t>();
    if (!id || *id < 0) return tl::unexpected(fmt::format("{}: expected a list of numbers", key));
    ids.push_back(static_cast<T>(*id));
  }
  return ids;
}

tl::expected<ClientClass, std::string> read_class(const toml::table& table) {
  static constexpr std::string_view kKeys[] = {"name",
                                               "uids",
                                               "gids",
                                               "cgroups",
                                               "allocations",
                                               "sm_percentage",
                                               "max_sm_percentage",
                                               "memory_limit",
                                               "max_memory_limit",
                                               "priority",
                                               "max_priority",
                                               "isolation"};
  for (auto&& [key, value] : table) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key.str()) == std::end(kKeys)) {
      return tl::unexpected(fmt::format("unknown key `{}` in a [[class]]; known: {}", key.str(),
                                        fmt::join(kKeys, ", ")));
    }
  }
  ClientClass cls;
  cls.line = static_cast<int>(table.source().begin.line);
  auto name = table["name"].value_exact<std::string>();
  if (!name || name->empty()) return tl::unexpected(std::string("a [[class]] needs a name"));
  cls.name = *name;
  auto uids = id_list<uid_t>(table, "uids");
  if (!uids) return tl::unexpected(uids.error());
  cls.uids = *uids;
  auto gids = id_list<gid_t>(table, "gids");
  if (!gids) return tl::unexpected(gids.error());
  cls.gids = *gids;
  if (const toml::node* node = table.get("cgroups")) {
    const toml::array* list = node->as_array();
    if (list == nullptr) return tl::unexpected(std::string("cgroups: expected a list of paths"));
    for (const toml::node& item : *list) {
      auto path = item.value_exact<std::string>();
      if (!path || !path->starts_with('/')) {
        return tl::unexpected(std::string("cgroups: expected paths starting with /"));
      }
      cls.cgroups.push_back(*path);
    }
  }
  if (const toml::node* node = table.get("allocations")) {
    auto flag = node->value_exact<bool>();
    if (!flag) return tl::unexpected(std::string("allocations: expected true or false"));
    cls.allocations = *flag;
  }
  for (auto [key, field] : {std::pair{"sm_percentage", &cls.sm_percentage},
                            std::pair{"max_sm_percentage", &cls.max_sm_percentage}}) {
    auto value = toml_int(table.get(key), key, 1, 100);
    if (!value) return tl::unexpected(value.error());
    *field = *value;
  }
  for (auto [key, field] : {std::pair{"memory_limit", &cls.memory_limit},
                            std::pair{"max_memory_limit", &cls.max_memory_limit}}) {
    auto value = toml_size(table.get(key), key);
    if (!value) return tl::unexpected(value.error());
    *field = *value;
  }
  if (const toml::node* node = table.get("priority")) {
    auto value = node->value_exact<std::int64_t>();
    if (!value || (*value != 0 && *value != 1)) {
      return tl::unexpected(std::string("priority: expected 0 (normal) or 1 (below normal)"));
    }
    cls.priority = static_cast<int>(*value);
  }
  if (const toml::node* node = table.get("max_priority")) {
    auto value = node->value_exact<std::string>();
    if (!value || (*value != "normal" && *value != "below-normal")) {
      return tl::unexpected(std::string("max_priority: expected \"normal\" or \"below-normal\""));
    }
    cls.below_normal_only = *value == "below-normal";
  }
  if (const toml::node* node = table.get("isolation")) {
    auto value = node->value_exact<std::string>();
    if (!value || (*value != "class" && *value != "rule")) {
      return tl::unexpected(std::string(
          "isolation: expected \"class\" (its clients are an isolation group of their own) or "
          "\"rule\" (mpsshimd --isolation places them)"));
    }
    cls.isolated = *value == "class";
  }
  if (cls.sm_percentage && cls.max_sm_percentage && *cls.sm_percentage > *cls.max_sm_percentage) {
    return tl::unexpected(std::string("sm_percentage is above max_sm_percentage"));
  }
  if (cls.memory_limit && cls.max_memory_limit && *cls.max_memory_limit != 0 &&
      (*cls.memory_limit == 0 || *cls.memory_limit > *cls.max_memory_limit)) {
    return tl::unexpected(std::string("memory_limit is above max_memory_limit"));
  }
  return cls;
}

}  // namespace

tl::expected<ConfigFile, std::string> read_config_file(const std::string& path) {
  ConfigFile config;
  config.path = path;
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& error) {
    if (error.source().begin.line == 0) {  // not even opened
      return tl::unexpected(fmt::format("{}: {}", path, std::string(error.description())));
    }
    return tl::unexpected(fmt::format("{}:{}: {}", path, error.source().begin.line,
                                      std::string(error.description())));
  }
  for (auto&& [key, value] : root) {
    const std::string name(key.str());
    if (name == "class") {
      const toml::array* list = value.as_array();
      if (list == nullptr || !list->is_array_of_tables()) {
        return tl::unexpected(fmt::format("{}: classes are [[class]] tables", at(path, value)));
      }
      for (const toml::node& item : *list) {
        auto cls = read_class(*item.as_table());
        if (!cls) return tl::unexpected(fmt::format("{}: {}", at(path, item), cls.error()));
        for (const ClientClass& other : config.classes) {
          if (other.name == cls->name) {
            return tl::unexpected(
                fmt::format("{}: a second class named `{}` (the first is on line {})",
                            at(path, item), cls->name, other.line));
          }
        }
        config.classes.push_back(std::move(*cls));
      }
      continue;
    }
    if (std::find(std::begin(kCommandLineOnly), std::end(kCommandLineOnly), name) !=
        std::end(kCommandLineOnly)) {
      return tl::unexpected(fmt::format("{}: `{}` belongs on the command line, not in the file",
                                        at(path, value), name));
    }
    auto words = option_words(name, value);
    if (!words) return tl::unexpected(fmt::format("{}: {}", at(path, value), words.error()));
    if (words->empty()) continue;
    if (auto checked = check_option(*words); !checked) {
      return tl::unexpected(fmt::format("{}: {}", at(path, value), checked.error()));
    }
    config.arguments.insert(config.arguments.end(), words->begin(), words->end());
  }
  return config;
}

const ClientClass* class_of(const std::vector<ClientClass>& classes,
                            const proto::PeerCredentials& peer, const std::string& cgroup,
                            bool has_allocation) {
  for (const ClientClass& cls : classes) {
    const bool any_rule =
        !cls.uids.empty() || !cls.gids.empty() || !cls.cgroups.empty() || cls.allocations;
    if (!any_rule) return &cls;
    if (std::find(cls.uids.begin(), cls.uids.end(), peer.uid) != cls.uids.end()) return &cls;
    if (std::find(cls.gids.begin(), cls.gids.end(), peer.gid) != cls.gids.end()) return &cls;
    if (cls.allocations && has_allocation) return &cls;
    for (const std::string& prefix : cls.cgroups) {
      // A prefix matches whole path components: /a/b holds /a/b and /a/b/c, not /a/bc.
      if (cgroup.starts_with(prefix) && (cgroup.size() == prefix.size() || prefix.ends_with('/') ||
                                         cgroup[prefix.size()] == '/')) {
        return &cls;
      }
    }
  }
  return nullptr;
}

std::string cgroup_of(pid_t pid) {
  std::ifstream file(fmt::format("/proc/{}/cgroup", pid));
  for (std::string line; std::getline(file, line);) {
    if (line.starts_with("0::")) return line.substr(3);
  }
  return "";
}

std::vector<std::string> apply_class(const ClientClass& cls, proto::ClientHello& hello) {
  // Defaults fill what the client did not ask; maximums lower what it asked (said in the log)
  // or bound what it left open (silently: nothing it asked for was refused).
  std::vector<std::string> lowered;
  const std::string whose = fmt::format("its class `{}`", cls.name);
  if (hello.active_thread_percentage == proto::kUnset && cls.sm_percentage) {
    hello.active_thread_percentage = *cls.sm_percentage;
  }
  if (cls.max_sm_percentage) {
    if (hello.active_thread_percentage == proto::kUnset) {
      hello.active_thread_percentage = *cls.max_sm_percentage;
    } else if (hello.active_thread_percentage > *cls.max_sm_percentage) {
      lowered.push_back(fmt::format("asked for {}% of the SMs; {} allows {}%; clamped",
                                    hello.active_thread_percentage, whose, *cls.max_sm_percentage));
      hello.active_thread_percentage = *cls.max_sm_percentage;
    }
  }
  if (hello.device_memory_limit == 0 && cls.memory_limit) {
    hello.device_memory_limit = *cls.memory_limit;
  }
  if (cls.max_memory_limit && *cls.max_memory_limit != 0) {
    if (hello.device_memory_limit == 0) {
      hello.device_memory_limit = *cls.max_memory_limit;
    } else if (hello.device_memory_limit > *cls.max_memory_limit) {
      lowered.push_back(fmt::format("asked for a memory limit of {}; {} allows {}; clamped",
                                    format_size(hello.device_memory_limit), whose,
                                    format_size(*cls.max_memory_limit)));
      hello.device_memory_limit = *cls.max_memory_limit;
    }
  }
  if (hello.priority == proto::kUnset && cls.priority) hello.priority = *cls.priority;
  if (cls.below_normal_only) {
    if (hello.priority == 0) {
      lowered.push_back(fmt::format("asked for normal priority; {} runs below normal", whose));
    }
    hello.priority = 1;
  }
  return lowered;
}

}  // namespace mpsshim::daemon

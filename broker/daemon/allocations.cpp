#include "broker/daemon/allocations.hpp"

#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

namespace {

std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> items;
  while (!text.empty()) {
    std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return items;
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

tl::expected<std::string, std::string> random_token() {
  unsigned char bytes[AllocationRegistry::kTokenHexDigits / 2];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return tl::unexpected(fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  std::string token;
  for (unsigned char b : bytes) token += fmt::format("{:02x}", b);
  return token;
}

bool is_token(std::string_view text) {
  return text.size() == AllocationRegistry::kTokenHexDigits &&
         std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Compares every byte, so the time taken says nothing about how much of a guess was right.
bool same_token(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

}  // namespace

bool is_kubernetes_name(std::string_view text) {
  return !text.empty() && text.size() <= 253 && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
  });
}

std::string with_pod_fields(const AllocationRegistry& allocations, const std::string& ps_text) {
  std::string out;
  std::size_t start = 0;
  while (start < ps_text.size()) {
    std::size_t end = ps_text.find('\n', start);
    if (end == std::string::npos) end = ps_text.size();
    std::string line = ps_text.substr(start, end - start);
    if (std::size_t at = line.find(" allocation="); at != std::string::npos) {
      std::uint32_t id = 0;
      const char* digits = line.c_str() + at + 12;
      std::from_chars(digits, line.c_str() + line.size(), id);
      const Allocation* allocation = allocations.find(id);
      if (allocation != nullptr && !allocation->pod_name.empty()) {
        line +=
            fmt::format(" namespace={} pod={}", allocation->pod_namespace, allocation->pod_name);
      }
    }
    out += line + "\n";
    start = end + 1;
  }
  return out;
}

std::string pod_of(const Allocation& allocation) {
  if (allocation.pod_name.empty()) return "-";
  return allocation.pod_namespace.empty() ? allocation.pod_name
                                          : allocation.pod_namespace + "/" + allocation.pod_name;
}

tl::expected<const Allocation*, std::string> AllocationRegistry::add(
    const std::vector<std::string>& words) {
  Allocation spec;
  for (const std::string& word : words) {
    std::size_t eq = word.find('=');
    if (eq == std::string::npos) {
      return tl::unexpected(fmt::format("`{}` is not key=value", word));
    }
    std::string_view key = std::string_view(word).substr(0, eq);
    std::string_view value = std::string_view(word).substr(eq + 1);
    if (key == "sm") {
      auto p = parse_int(value);
      if (!p || *p < 1 || *p > 100) {
        return tl::unexpected(fmt::format("sm={}: expected a percentage 1-100", value));
      }
      spec.sm_percentage = *p;
    } else if (key == "memory") {
      auto bytes = parse_size(value);
      if (!bytes)
        return tl::unexpected(fmt::format("memory={}: expected a size (4G, 512M)", value));
      spec.memory_limit = *bytes;
    } else if (key == "gpus") {
      for (const std::string& item : split_commas(value)) {
        auto gpu = parse_int(item);
        if (!gpu || *gpu < 0) return tl::unexpected(fmt::format("gpus={}: `{}`", value, item));
        spec.gpus.push_back(*gpu);
      }
    } else if (key == "devices") {
      spec.devices = split_commas(value);
      for (const std::string& device : spec.devices) {
        // The plugin's IDs are `<GPU UUID>::<replica>`.
        std::string plain = device;
        std::replace(plain.begin(), plain.end(), ':', '-');
        if (!is_kubernetes_name(plain)) return tl::unexpected(fmt::format("devices: `{}`", device));
      }
    } else if (key == "namespace" || key == "pod") {
      if (!is_kubernetes_name(value)) return tl::unexpected(fmt::format("{}=`{}`", key, value));
      (key == "pod" ? spec.pod_name : spec.pod_namespace) = std::string(value);
    } else if (key == "slot") {
      std::size_t slash = value.find('/');
      auto slot = parse_int(value.substr(0, slash));
      auto slots =
          slash == std::string_view::npos ? std::nullopt : parse_int(value.substr(slash + 1));
      if (!slot || !slots || *slots < 1 || *slots > 1024 || *slot < 0 || *slot >= *slots) {
        return tl::unexpected(fmt::format("slot={}: expected N/M with 0 <= N < M <= 1024", value));
      }
      spec.sm_slot = static_cast<unsigned>(*slot);
      spec.sm_slots = static_cast<unsigned>(*slots);
    } else if (key == "isolation") {
      if (value != "own" && value != "shared") {
        return tl::unexpected(fmt::format("isolation={}: expected own or shared", value));
      }
      spec.own_isolation_group = value == "own";
    } else if (key == "token") {
      if (!is_token(value)) {
        return tl::unexpected(
            fmt::format("token=: expected {} lowercase hex digits", kTokenHexDigits));
      }
      spec.token = std::string(value);
    } else {
      return tl::unexpected(fmt::format(
          "unknown key `{}` (sm, memory, gpus, devices, namespace, pod, slot, token, isolation)",
          key));
    }
  }
  if (by_id_.size() >= kMaxAllocations) {
    return tl::unexpected(fmt::format("{} allocations are registered already", kMaxAllocations));
  }
  if (spec.token.empty()) {
    auto token = random_token();
    if (!token) return tl::unexpected(token.error());
    spec.token = std::move(*token);
  }
  std::erase_if(by_id_, [&](const auto& entry) {
    const Allocation& old = entry.second;
    if (same_token(old.token, spec.token)) return true;
    return std::any_of(old.devices.begin(), old.devices.end(), [&](const std::string& d) {
      return std::find(spec.devices.begin(), spec.devices.end(), d) != spec.devices.end();
    });
  });
  spec.id = next_id_++;
  auto [it, inserted] = by_id_.emplace(spec.id, std::move(spec));
  return &it->second;
}

bool AllocationRegistry::revoke(std::uint32_t id) {
  return by_id_.erase(id) != 0;
}

bool AllocationRegistry::label(std::uint32_t id, std::string pod_namespace, std::string pod_name) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  it->second.pod_namespace = std::move(pod_namespace);
  it->second.pod_name = std::move(pod_name);
  return true;
}

const Allocation* AllocationRegistry::find_token(std::string_view token) const {
  const Allocation* found = nullptr;
  for (const auto& [id, allocation] : by_id_) {
    if (same_token(allocation.token, token)) found = &allocation;
  }
  return found;
}

const Allocation* AllocationRegistry::find(std::uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

}  // namespace mpsshim::daemon

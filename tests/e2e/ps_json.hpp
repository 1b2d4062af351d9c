// A client as `mpsshimctl ps --json` shows it, for the e2e tests that follow clients' states.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "harness.hpp"

namespace mpsshim::e2e {

// The client `pid`'s entry in `mpsshimctl ps --json` (null when it is not listed).
inline nlohmann::json ps_entry(const Daemon& daemon, int pid) {
  const Outcome ps = daemon.ctl({"ps", "--json"});
  if (ps.exit_code != 0) return nullptr;
  const nlohmann::json parsed = nlohmann::json::parse(ps.out, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("clients")) return nullptr;
  for (const nlohmann::json& entry : parsed["clients"]) {
    if (entry.value("pid", -1) == pid) return entry;
  }
  return nullptr;
}

// Its `state` ("active", "suspended", "preempted", ...), empty when it is not listed.
inline std::string state_of(const Daemon& daemon, int pid) {
  const nlohmann::json entry = ps_entry(daemon, pid);
  return entry.is_object() ? entry.value("state", std::string()) : std::string();
}

}  // namespace mpsshim::e2e

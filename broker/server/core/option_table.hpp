// Every setting of mpsshim-server in one table: its flag, the values it takes, its default and
// what it does. Read by the server's parser (options.cpp), by mpsshimd's options that pass a
// setting on to every server and by that pass-through (broker/daemon/options.cpp,
// supervisor.cpp), by both usage texts, and by the test that holds docs/daemon.md to it.
//
// Compiled into mpsshimd as well: it includes nothing of the server above accounting/ and
// scheduling/'s option parsers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

namespace mpsshim::server {

enum class Setting : std::uint8_t {
  kDevice,
  kControlFd,
  kDriver,
  kLogLevel,
  kDefaultSmPercentage,
  kDefaultMemoryLimit,
  kWorkers,
  kContextIdleTimeout,
  kSpinClients,
  kHostFences,
  kFenceWatch,
  kCrowdedFenceMaxQueued,
  kEventPollUs,
  kShareImages,
  kImageIdleTimeout,
  kImageVerdictDir,
  kBusyTime,
  kPriorityScheduling,
  kPriorityMaxHoldUs,
  kPriorityFencePollUs,
  kPriorityRunAhead,
  kPriorityReserveSms,
  kLaunchBatch,
  kLaunchBatchMin,
  kLaunchBatchGraphs,
  kLaunchBatchRamp,
  kLaunchBatchKeepNodes,
  kLaunchBatchPrepare,
  kMemoryPreemption,
  kPreemptionIdleMs,
  kMemoryOvercommit,
  kParkPool,
  kClientLimit,
};

enum class ValueKind : std::uint8_t {
  kNumber,      // a whole number from `min` to `max`, or one of `words` (WORD=NUMBER|...)
  kBytes,       // a whole number of bytes, any 64-bit one
  kSwitch,      // on or off
  kChoice,      // one of `words` (a|b|c)
  kText,        // anything not empty (a path)
  kLevel,       // error, warn, info, debug or trace (common/log.hpp)
  kSmReserve,   // N SMs or P% (scheduling/sm_reserve_option.hpp)
  kNamedLimit,  // NAME=N (accounting/client_limits.hpp)
};

// How mpsshimd sets a server's setting.
enum class PassedBy : std::uint8_t {
  kDaemonOption,  // an mpsshimd option of the same name (or `daemon_flag`), passed as given
  kDaemon,        // the daemon's own state: the GPU, the control socket, its --driver and
                  // --log-level, the defaults mpsshimctl may change live
};

struct ServerOption {
  Setting setting{};
  std::string_view flag{};        // mpsshim-server's, without the dashes
  std::string_view value_name{};  // in usage texts: N, SECS, on|off...
  ValueKind kind{};
  std::int64_t min = 0;
  std::int64_t max = 0;
  std::string_view words{};  // kChoice: a|b|c; kNumber: WORD=NUMBER|... also accepted
  // The value when the flag is not given, as the flag takes it; empty where the server
  // works it out (from the CPUs it may run on) or where the flag is required.
  std::string_view default_value{};
  // The default as docs/daemon.md and the usage texts say it; empty: default_value.
  std::string_view default_text{};
  std::string_view help{};
  PassedBy passed_by = PassedBy::kDaemonOption;
  std::string_view daemon_flag{};  // mpsshimd's name when it differs from `flag`
  bool required = false;
  bool repeatable = false;  // each one adds (NAME=N of different names)
};

std::span<const ServerOption> server_options();
const ServerOption& server_option(Setting setting);
// By mpsshim-server's flag, without the dashes; null when there is none.
const ServerOption* find_server_option(std::string_view flag);
// mpsshimd's option that passes it on (empty for PassedBy::kDaemon).
std::string_view daemon_flag_of(const ServerOption& option);
// The default as a user reads it.
std::string_view default_text_of(const ServerOption& option);

// Checks `value` for `option`: the value as the server is given it (a word replaced by its
// number, an SM reserve in its normal form), or the error, which names `as` (the flag the user
// typed, with its dashes).
tl::expected<std::string, std::string> check_option_value(const ServerOption& option,
                                                          std::string_view value,
                                                          std::string_view as);

// The values column of docs/daemon.md's tables: "0–256 (64)", "`on`", "repeatable"...
std::string documented_values(const ServerOption& option);

// "  --flag VALUE   help (default ...)" for each option, wrapped to the usage texts' width;
// with `daemon_names`, under mpsshimd's names (daemon_flag_of).
std::string option_help_lines(std::span<const ServerOption> options, bool daemon_names);

// Settings mpsshimd passes on to every server (PassedBy::kDaemonOption), each checked when
// given and kept in the form the server takes, in the order given; a later value replaces an
// earlier one except for repeatable flags.
class PassedSettings {
 public:
  void set(Setting setting, std::string value);
  void erase(Setting setting);
  // The value given last; null when not given.
  const std::string* find(Setting setting) const;
  // --flag value, for each one.
  std::vector<std::string> arguments() const;

 private:
  std::vector<std::pair<Setting, std::string>> values_;
};

}  // namespace mpsshim::server

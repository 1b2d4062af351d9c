// mpsshimd --config FILE (docs/config.md): the daemon's options and client classes in TOML.
//
// Every top-level key is a long option of mpsshimd's command line, with the same value
// (`isolation = "user"`, `default-memory-limit = "4G"`, `busy-time = "on"`, `multiuser = true`);
// the command line wins over the file. `[[class]]` tables group clients by uid, gid, cgroup or
// Kubernetes allocation and give them defaults and maximums; a client's own settings are
// clamped to its class. A file that cannot be read or holds a mistake is refused whole, with the
// line and the reason.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

struct ClientClass {
  std::string name;
  int line = 0;  // where the file defines it, for messages
  // Who belongs (any one of these lists matching is enough; a class without any matches
  // every client, so it serves as a catch-all at the end).
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  std::vector<std::string> cgroups;  // prefixes of the client's cgroup v2 path
  bool allocations = false;          // clients with a Kubernetes allocation token
  // What its clients get.
  std::optional<int> sm_percentage;               // default when the client asks none
  std::optional<int> max_sm_percentage;           // a client asking more gets this
  std::optional<std::uint64_t> memory_limit;      // default per GPU when the client asks none
  std::optional<std::uint64_t> max_memory_limit;  // a client asking more (or none) gets this
  std::optional<int> priority;                    // default CUDA_MPS_CLIENT_PRIORITY (0 or 1)
  bool below_normal_only = false;                 // max_priority = "below-normal"
  bool isolated = false;  // isolation = "class": the class is an isolation group of its own
};

struct ConfigFile {
  std::string path;
  std::vector<std::string> arguments;  // the options, as command-line words
  std::vector<ClientClass> classes;    // in the file's order: the first match wins
};

// Reads and checks `path`: the options are checked by mpsshimd's own parser, one at a time, so
// a mistake is reported at its line ("FILE:12: --isolation takes ...").
tl::expected<ConfigFile, std::string> read_config_file(const std::string& path);

// The first class `peer` (and its hello) belongs to, or nullptr. `cgroup`: the client's cgroup
// v2 path ("" when unknown).
const ClientClass* class_of(const std::vector<ClientClass>& classes,
                            const proto::PeerCredentials& peer, const std::string& cgroup,
                            bool has_allocation);

// The cgroup v2 path of `pid` (the "0::" line of /proc/<pid>/cgroup), or "".
std::string cgroup_of(pid_t pid);

// Applies `cls` to a client's hello: defaults where it asked nothing, maximums where it asked
// more. Returns one sentence per setting that was lowered.
std::vector<std::string> apply_class(const ClientClass& cls, proto::ClientHello& hello);

}  // namespace mpsshim::daemon

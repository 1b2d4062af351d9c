// GPU faults the servers reported, each with its likely culprit (docs/isolation.md, "Which
// client faulted"). A server that hits a sticky fault tells the daemon, before it exits, which
// client's work first returned the error (kServerFault); that client is the likely cause.
// NVIDIA MPS cannot say this. Kept for `mpsshimctl ps`, the metrics and
// --isolate-after-fault.
//
// Owned by the Supervisor and, like it, touched only on the daemon's event loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "broker/daemon/event_loop.hpp"

namespace mpsshim::daemon {

struct FaultReport {
  int gpu = 0;
  std::string group;  // the server's isolation group; "" for the GPU's shared server
  pid_t server_pid = 0;
  int error = 0;           // the CUresult
  std::string error_name;  // "CUDA_ERROR_ILLEGAL_ADDRESS"
  // The client whose work returned the fault first; client 0 when the server knew none.
  std::uint32_t client = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  std::string program;
  std::string op;  // the call that returned it ("CtxSynchronize"), "-" when none
  std::size_t clients_ended = 0;
  std::chrono::system_clock::time_point when{};
  Clock::time_point seen{};
};

// The server's kServerFault text, "client=N pid=N uid=N clients=N op=NAME error=NAME
// program=REST" (the program name, any text, takes the rest), with its status (the CUresult).
// The GPU, group, server pid and times are the caller's to fill in.
tl::expected<FaultReport, std::string> parse_fault_report(std::string_view text, int status);

// "GPU fault on GPU 0 (CUDA_ERROR_ILLEGAL_ADDRESS) at 2026-11-29T03:43:05: first returned by the
// work of client pid 1131 (tenant_peek, uid 0; isolation group client:1131), its likely cause;
// 2 client(s) ended"
std::string describe_fault(const FaultReport& report);
nlohmann::json fault_json(const FaultReport& report);

class FaultLog {
 public:
  static constexpr std::size_t kKept = 16;  // the most recent reports `recent()` keeps

  void add(FaultReport report);
  // Oldest first.
  const std::deque<FaultReport>& recent() const { return recent_; }
  // Faults per (gpu, uid, program) of their culprit since the daemon started (the metric
  // mpsshim_client_faults_total); reports without a culprit are not counted here.
  using Key = std::tuple<int, uid_t, std::string>;
  const std::map<Key, std::uint64_t>& by_culprit() const { return by_culprit_; }
  // The latest fault within `window` before `now` whose culprit ran `program` as `uid`.
  std::optional<FaultReport> recent_culprit(uid_t uid, std::string_view program,
                                            Clock::time_point now,
                                            std::chrono::seconds window) const;

 private:
  std::deque<FaultReport> recent_;
  std::map<Key, std::uint64_t> by_culprit_;
  // uid, program -> when its last fault was seen (for recent_culprit beyond kKept reports).
  std::map<std::pair<uid_t, std::string>, FaultReport, std::less<>> last_by_program_;
};

}  // namespace mpsshim::daemon

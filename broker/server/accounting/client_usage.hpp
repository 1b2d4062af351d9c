// What a client used of the GPU, kept in its session by the worker that owns it: GPU busy
// time (busy_time.hpp), bytes copied each way, device memory peak, pinned host memory, and when
// it connected. `mpsshimctl ps` and the Prometheus metrics show it (with the session's launches,
// memory in use, quota, limit and priority) through the line format_client_usage writes.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mpsshim::server {

class Session;

struct ClientUsage {
  std::uint64_t busy_ns = 0;     // GPU time of its streams' work, summed over its streams
  std::uint64_t busy_spans = 0;  // measured spans (busy_time.hpp)
  // Bytes of the copies the server issued for it (cuMemcpy*, staged pieces each counted once;
  // copies inside the client's graphs are not seen).
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t bytes_d2d = 0;
  std::uint64_t pinned_bytes = 0;  // pinned host memory it holds (cuMemAllocHost, registered)
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
};

// The `ps` line of a session, blank-separated key=value fields, newline-terminated:
//   client=3 pid=4123 uid=1000 program=python3 sms=32 sm_percentage=25 mem_used=1048576
//   mem_peak=2097152 mem_limit=0 pinned=0 launches=1234 busy_us=51234 h2d_bytes=4096
//   d2h_bytes=4096 d2d_bytes=0 priority=0 state=active start_time=1732182049.123 allocation=7
//   partition=0 held_us=0 sms_held_back=0
// Bytes in bytes (mem_limit=0: none), busy time in microseconds, start_time in unix seconds,
// allocation the id of the pod's allocation it belongs to (0: none; docs/kubernetes.md).
// sms= counts the SMs its work runs on now; sms_held_back= those of its share it leaves to
// normal-priority clients now (priority_reserve.hpp).
std::string format_client_usage(const Session& session);

}  // namespace mpsshim::server

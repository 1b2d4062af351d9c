#include "broker/server/session/suspension.hpp"

#include <fmt/format.h>

#include <thread>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "broker/server/session/vmm_park.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

using Clock = std::chrono::steady_clock;

// Why the session's memory cannot be parked now, or empty.
std::string why_not_parkable(Session& s) {
  if (!s.gpu().heap) {
    return "this server lets the driver place device memory (no address arena), so the memory "
           "could not come back at the same addresses";
  }
  if (!s.ipc_memory.exports.empty()) {
    return "it exported memory with cuIpcGetMemHandle, which other processes may have mapped";
  }
  if (s.gpu().heap->exported(s.client.id)) {
    return "other clients or another GPU's server may use its memory (an IPC handle, also of "
           "memory it has freed since, or peer access)";
  }
  if (std::string why = why_vmm_not_parkable(s); !why.empty()) return why;
  if (s.active_captures != 0) return "one of its streams is capturing a graph";
  return {};
}

// Waits until everything the client issued so far has run, at most `limit`: an event recorded
// on each of its busy streams, polled. The first error of the client's work, or
// CUDA_ERROR_TIMEOUT.
CUresult wait_for_issued_work(Session& s, std::chrono::milliseconds limit) {
  auto fences = s.fence_all_streams();
  if (!fences) return fences.error();
  const auto deadline = Clock::now() + limit;
  CUresult result = CUDA_SUCCESS;
  std::size_t done = 0;
  while (done < fences->size()) {
    const CUresult r = s.cu().cuEventQuery((*fences)[done]);
    if (r == CUDA_SUCCESS) {
      ++done;
      continue;
    }
    if (r != CUDA_ERROR_NOT_READY) {
      result = r;
      break;
    }
    if (Clock::now() > deadline) {
      result = CUDA_ERROR_TIMEOUT;
      break;
    }
    // Polled, not waited on: a client kernel that never ends must not hold the worker for good.
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (CUevent e : *fences) s.release_event(e);
  return result;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string rate(std::uint64_t bytes, double seconds) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.1f} GB/s", static_cast<double>(bytes) / seconds / 1e9);
}

// A stream of the client's green context for the copies, destroyed at the end of scope.
class CopyStream {
 public:
  explicit CopyStream(Session& s) : s_(s) {
    result_ = s.cu().cuGreenCtxStreamCreate(&stream_, s.green.green, CU_STREAM_NON_BLOCKING, 0);
  }
  ~CopyStream() {
    if (stream_ != nullptr) s_.cu().cuStreamDestroy_v2(stream_);
  }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  CUresult result() const { return result_; }
  CUstream get() const { return stream_; }

 private:
  Session& s_;
  CUstream stream_ = nullptr;
  CUresult result_ = CUDA_SUCCESS;
};

}  // namespace

tl::expected<std::string, std::string> suspend_session(Session& s,
                                                       std::chrono::milliseconds work_wait) {
  if (s.suspension.on) return tl::unexpected(fmt::format("{} is suspended already", s.who()));
  if (std::string why = why_not_parkable(s); !why.empty()) {
    return tl::unexpected(fmt::format("{} cannot be suspended: {}", s.who(), why));
  }
  const auto start = Clock::now();
  if (CUresult r = wait_for_issued_work(s, work_wait); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_TIMEOUT) {
      return tl::unexpected(fmt::format(
          "{} was not suspended: the work it issued did not finish within {} s", s.who(),
          std::chrono::duration_cast<std::chrono::seconds>(work_wait).count()));
    }
    return tl::unexpected(
        fmt::format("{} was not suspended: its work failed: {}", s.who(), describe(s.cu(), r)));
  }
  const double wait_seconds = seconds_since(start);
  CopyStream stream(s);
  if (stream.result() != CUDA_SUCCESS) {
    return tl::unexpected(fmt::format("{} was not suspended: creating a copy stream: {}", s.who(),
                                      describe(s.cu(), stream.result())));
  }
  const auto copy_start = Clock::now();
  auto not_parked = [&](CUresult r) {
    return tl::unexpected(
        fmt::format("{} was not suspended: parking its memory on the host failed: {}", s.who(),
                    describe(s.cu(), r)));
  };
  // Its physical allocations are copied out first and released only once the heap's blocks are
  // parked too: all or nothing (vmm_park.hpp).
  auto vmm = copy_out_vmm(s, stream.get());
  if (!vmm) return not_parked(vmm.error());
  auto parked = s.gpu().heap->park(s.client.id, stream.get());
  if (!parked) {
    drop_vmm_copies(s);
    return not_parked(parked.error());
  }
  const std::uint64_t vmm_released = release_copied_vmm(s);
  parked->bytes += vmm_released;
  parked->pooled += vmm_released == vmm->bytes ? vmm->pooled : 0;
  const double copy_seconds = seconds_since(copy_start);
  s.suspension.on = true;
  s.suspension.by_policy = false;  // the memory policies mark their own (memory_arbiter.hpp)
  s.suspension.parked_bytes = parked->bytes;
  s.suspension.since = Clock::now();
  ++s.suspension.count;
  std::string said = fmt::format(
      "{}: suspended; {} parked on the host in {:.3f} s ({}){}, after {:.3f} s waiting for its "
      "issued work",
      s.who(), format_bytes(parked->bytes), copy_seconds, rate(parked->bytes, copy_seconds),
      parked->pooled == 0
          ? std::string()
          : fmt::format(" ({} of it in the park pool)", format_bytes(parked->pooled)),
      wait_seconds);
  log_info("{}", said);
  return said;
}

tl::expected<std::string, std::string> resume_session(Session& s) {
  if (!s.suspension.on) return tl::unexpected(fmt::format("{} is not suspended", s.who()));
  CopyStream stream(s);
  if (stream.result() != CUDA_SUCCESS) {
    return tl::unexpected(fmt::format("{} was not resumed: creating a copy stream: {}", s.who(),
                                      describe(s.cu(), stream.result())));
  }
  const auto start = Clock::now();
  auto not_resumed = [&](CUresult r) {
    return tl::unexpected(fmt::format(
        "{} was not resumed and stays suspended: putting its {} back on the GPU failed: {}",
        s.who(), format_bytes(s.suspension.parked_bytes), describe(s.cu(), r)));
  };
  auto vmm = restore_vmm(s, stream.get());
  if (!vmm) return not_resumed(vmm.error());
  auto back = s.gpu().heap->unpark(s.client.id, stream.get(), s.gpu().primary);
  if (!back) {
    unrestore_vmm(s);
    std::string said = not_resumed(back.error()).value();
    if (*vmm != 0) {
      said += fmt::format(" (its {} of cuMemCreate memory, put back first, was taken off again)",
                          format_bytes(*vmm));
    }
    return tl::unexpected(said);
  }
  free_vmm_copies(s, s.gpu().primary);
  *back += *vmm;
  const double copy_seconds = seconds_since(start);
  const auto now = Clock::now();
  s.suspension.earlier = s.suspension.total(now);
  s.suspension.on = false;
  s.suspension.by_policy = false;
  s.suspension.parked_bytes = 0;
  std::string said = fmt::format("{}: resumed; {} back on the GPU in {:.3f} s ({})", s.who(),
                                 format_bytes(*back), copy_seconds, rate(*back, copy_seconds));
  log_info("{}", said);
  return said;
}

}  // namespace mpsshim::server

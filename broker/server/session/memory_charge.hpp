// The device memory charged to one session, and through it to its allocation (a Kubernetes pod's
// limit shared by its clients on this GPU): the limit and who set it, what is charged, the peak,
// and the bytes that closers of memory it exported give back.
//
// Owned by the session's worker: admission sets the limit and the allocation before the session
// is placed, and mpsshimctl's live limit runs on the owning worker. Invariants: used() is what
// the session holds, and the allocation is charged exactly as much on its behalf (both change
// together, in reserve and release); a charge past either limit is refused before the driver is
// asked, so that two clients of one allocation on different workers cannot both pass.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include <tl/expected.hpp>

#include "broker/server/accounting/allocation_account.hpp"
#include "broker/server/session/ipc_registry.hpp"

namespace mpsshim::server {

// Which limit refused a charge of device memory.
enum class MemoryLimitHit {
  kClient,      // the session's own (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT or the server's default)
  kAllocation,  // the limit every client of the session's allocation shares
};

// Who set a session's limit (the log line of a refusal names it).
enum class LimitSource : std::uint8_t {
  kServerDefault,  // the server's --default-memory-limit (0: none)
  kClient,         // CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
  kOperator,       // set live: mpsshimctl set_device_pinned_mem_limit
};

class MemoryCharge;

// A charge taken before the driver is asked for the memory. Given back when destroyed unless
// kept (the driver call succeeded).
class MemoryReservation {
 public:
  MemoryReservation(MemoryCharge& charge, std::uint64_t bytes) : charge_(&charge), bytes_(bytes) {}
  MemoryReservation(MemoryReservation&& other) noexcept
      : charge_(std::exchange(other.charge_, nullptr)), bytes_(other.bytes_) {}
  MemoryReservation& operator=(MemoryReservation&&) = delete;
  ~MemoryReservation();
  // The driver call succeeded: the session holds the memory until it frees it.
  void keep();

 private:
  MemoryCharge* charge_;
  std::uint64_t bytes_;
};

class MemoryCharge {
 public:
  std::uint64_t limit() const { return limit_; }  // 0: the whole device
  LimitSource limit_source() const { return source_; }
  void set_limit(std::uint64_t bytes, LimitSource source) {
    limit_ = bytes;
    source_ = source;
  }
  std::uint64_t used() const { return used_; }
  std::uint64_t peak() const { return peak_; }  // the most used() has been after a kept charge
  bool over_limit(std::uint64_t more) const {
    return limit_ != 0 && (more > limit_ || used_ > limit_ - more);
  }

  // The allocation this client belongs to, shared with its other clients on this GPU; null for
  // a client without an allocation token.
  const std::shared_ptr<AllocationAccount>& allocation() const { return allocation_; }
  void set_allocation(std::shared_ptr<AllocationAccount> allocation) {
    allocation_ = std::move(allocation);
  }

  // Charges `bytes` to the session and its allocation, or names the limit it would pass.
  tl::expected<MemoryReservation, MemoryLimitHit> reserve(std::uint64_t bytes);
  // Gives back device memory the client freed (at most what is charged).
  void release(std::uint64_t bytes);
  // Gives back what the last closers of allocations it freed while exported have freed since;
  // called before every charge and every memory query.
  void take_back_returned();
  // Where those closers add the bytes (ipc_registry.hpp), shared with the session's exports.
  const std::shared_ptr<IpcReturnedBytes>& returned() const { return returned_; }

 private:
  friend class MemoryReservation;
  void note_kept() { peak_ = std::max(peak_, used_); }

  std::uint64_t limit_ = 0;
  LimitSource source_ = LimitSource::kServerDefault;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
  std::shared_ptr<AllocationAccount> allocation_;
  std::shared_ptr<IpcReturnedBytes> returned_ = std::make_shared<IpcReturnedBytes>();
};

}  // namespace mpsshim::server

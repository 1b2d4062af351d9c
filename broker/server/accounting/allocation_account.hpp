// The device memory of one allocation (a Kubernetes pod's share of this GPU, registered with
// mpsshimd by the device plugin), shared by all its clients: a launcher and its workers draw on
// one limit, not one each (docs/kubernetes.md).
//
// Ownership: the coordinator creates an account when the first client of an allocation is
// admitted and keeps a weak reference to find it for the next; each session of the allocation
// holds a strong one. Sessions of one allocation may be served by different workers, so the
// count is atomic and a charge is a compare-and-swap that never lets the sum pass the limit.
#pragma once

#include <atomic>
#include <cstdint>

namespace mpsshim::server {

class AllocationAccount {
 public:
  AllocationAccount(std::uint32_t id, std::uint64_t limit) : id_(id), limit_(limit) {}

  // Adds `bytes` unless the sum would pass the limit (0 = none); false then, nothing changed.
  bool try_charge(std::uint64_t bytes);
  // Gives back what try_charge took (at most what is charged).
  void release(std::uint64_t bytes);

  std::uint32_t id() const { return id_; }
  std::uint64_t limit() const { return limit_; }
  std::uint64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const std::uint32_t id_;
  const std::uint64_t limit_;
  std::atomic<std::uint64_t> used_{0};
};

}  // namespace mpsshim::server

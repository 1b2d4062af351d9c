// Memory policies (docs/suspend.md, "Policies"): what the server does when a client's cuMemAlloc
// or cuMemCreate does not fit on the GPU, instead of failing it at once. Both are off by default.
//
// - Preemption (mpsshim-server --memory-preemption on): the allocation of a normal-priority
//   client suspends idle below-normal clients (session/suspension.hpp), least recently active
//   first, until it fits. They are resumed, in the order they were suspended, once the GPU has
//   room for them again.
// - Overcommit (--memory-overcommit PERCENT): clients are admitted while their memory limits add
//   up to at most PERCENT of the GPU's memory, and a client whose allocation does not fit is
//   suspended itself, its allocation unanswered, until the GPU has room for its memory and the
//   allocation.
//
// Who does what. The client's worker finds that the allocation does not fit, keeps the record's
// answer owed (Session::memory_wait) and posts a MemoryWant here. The coordinator takes the wants
// at its next look (Server::arbitrate_memory, core/memory_policy.cpp): it asks the workers for
// idle below-normal clients, has their workers suspend them, and has the wanting client's
// worker try the allocation again. The clients it suspended are the coordinator's to resume.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace mpsshim::server {

struct MemoryPolicySettings {
  bool preemption = false;                     // --memory-preemption
  std::chrono::milliseconds idle_after{1000};  // --preemption-idle-ms
  unsigned overcommit_percent = 0;             // --memory-overcommit; 0: off
  bool on() const { return preemption || overcommit_percent != 0; }
};

// An allocation that did not fit, posted by the client's worker.
struct MemoryWant {
  std::uint32_t client = 0;  // Session::client.id
  std::uint64_t bytes = 0;
  bool below_normal = false;  // such a client preempts no one; under overcommit it waits
  // A cuMemAlloc or cuMemAllocPitch, placed by the server's heap: preempted clients' memory can
  // be handed to it (device_heap.hpp). A cuMemCreate makes the client's own allocation.
  bool heap_allocation = false;
};

// A client the coordinator suspended for memory: a below-normal one preempted for another
// (`waiting` false), or, under overcommit, one that waits for room for its own allocation of
// `asked` bytes.
struct PolicySuspended {
  std::uint32_t client = 0;
  std::uint64_t parked = 0;
  std::uint64_t asked = 0;
  bool waiting = false;
  std::chrono::steady_clock::time_point since{};
};

class MemoryArbiter {
 public:
  // `wake` tells the coordinator to look (Server::wake).
  MemoryArbiter(MemoryPolicySettings settings, std::function<void()> wake)
      : settings_(settings), wake_(std::move(wake)) {}
  MemoryArbiter(const MemoryArbiter&) = delete;
  MemoryArbiter& operator=(const MemoryArbiter&) = delete;

  const MemoryPolicySettings& settings() const { return settings_; }
  // Whether `want` may wait at all: preemption for a normal client, overcommit for any.
  bool may_wait(bool below_normal) const {
    return (settings_.preemption && !below_normal) || settings_.overcommit_percent != 0;
  }

  // ---- any thread (workers) ----------------------------------------------------------------
  // Queues `want` and wakes the coordinator.
  void want(const MemoryWant& want);
  bool has_wants() const { return has_wants_.load(std::memory_order_acquire); }

  // ---- the coordinator -----------------------------------------------------------------------
  std::vector<MemoryWant> take_wants();
  std::vector<PolicySuspended>& suspended() { return suspended_; }

 private:
  const MemoryPolicySettings settings_;
  const std::function<void()> wake_;
  std::mutex mutex_;
  std::vector<MemoryWant> wants_;  // guarded by mutex_
  std::atomic<bool> has_wants_{false};
  std::vector<PolicySuspended> suspended_;  // the coordinator's alone
};

}  // namespace mpsshim::server

// The addresses memory preemption prepares for the allocation it suspends clients for
// (DeviceHeap::start_handover), and what is already mapped there.
//
// Why: a preempted client's own physical allocations (cuMemCreate: PyTorch's expandable segments,
// thousands of 2 or 20 MiB pieces) are each mapped whole into the server's arena for the suspend's
// copy (session/vmm_park.hpp). Mapping them again where the waiting allocation goes costs the
// driver 25-42 us each for their access (tools/probes/parallel_map.cpp; 108-130 ms for 3,073 on an
// H200), after the last suspend, on the path of the allocation that waits. So the suspend's views
// are placed here, one after another, and a view whose client's suspend went ahead stays mapped:
// it is already part of the allocation.
//
// Bookkeeping only, no driver call; not thread-safe: DeviceHeap holds its mutex around every use.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace mpsshim::server {

class HandoverRange {
 public:
  // A stretch of the range, in address order.
  struct Part {
    enum class Kind {
      kHole,     // nothing mapped
      kKept,     // a view kept: `handle` is mapped there, another client's bytes on it
      kViewing,  // a view whose suspend has not ended yet: its client's memory
    };
    CUdeviceptr at = 0;
    std::uint64_t bytes = 0;
    Kind kind = Kind::kHole;
    CUmemGenericAllocationHandle handle = 0;
  };

  bool empty() const { return bytes_ == 0; }
  CUdeviceptr base() const { return base_; }
  std::uint64_t bytes() const { return bytes_; }

  // Starts over with [base, base + bytes), nothing placed.
  void reset(CUdeviceptr base, std::uint64_t bytes);
  // Room for a view of `bytes` after the last one placed, at a multiple of `alignment` (a power
  // of two); nullopt when it does not fit.
  std::optional<CUdeviceptr> place(std::uint64_t bytes, std::uint64_t alignment);
  // The view placed at `at` kept with the physical allocation `handle` mapped there; false when
  // no view is being made there.
  bool keep(CUdeviceptr at, CUmemGenericAllocationHandle handle);
  // The view placed at `at` is gone (unmapped): a hole now. False when `at` is not in the range.
  bool forget(CUdeviceptr at);
  // Whether a view placed here is still being copied through.
  bool viewing() const;
  std::uint64_t kept_bytes() const;
  std::size_t kept_count() const;
  // The whole range as parts, holes included, and the range emptied.
  std::vector<Part> take();

 private:
  struct Slot {
    std::uint64_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;  // 0: still viewing
  };
  CUdeviceptr base_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t next_ = 0;  // offset after the last view placed
  std::map<CUdeviceptr, Slot> slots_;
};

}  // namespace mpsshim::server

// What a program advised (cuMemAdvise) and prefetched (cuMemPrefetchAsync) for its managed memory,
// page by page as the driver keeps it, so that cuMemRangeGetAttribute answers what the driver
// would. Under mpsshim managed memory stays where it was allocated (host memory the device maps,
// docs/host-memory.md): the advice and the prefetches change where nothing lives, but a program
// that reads them back must find what it set.
//
// Thread safety: ManagedAdvice is locked inside; AdviceSpans is not (ManagedAdvice owns each).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace mpsshim::shim {

// A processor as the driver's range attributes name one.
struct Location {
  CUmemLocationType type = CU_MEM_LOCATION_TYPE_INVALID;
  int id = 0;
  bool operator==(const Location&) const = default;
};

struct PageAdvice {
  bool read_mostly = false;
  Location preferred;
  Location last_prefetch;
  // Devices (bit d) and the host (kHostBit) with CU_MEM_ADVISE_SET_ACCESSED_BY.
  std::uint64_t accessed_by = 0;
  bool operator==(const PageAdvice&) const = default;
};
inline constexpr std::uint64_t kHostBit = std::uint64_t{1} << 63;

// The advice of one allocation's pages: runs of pages with equal advice.
class AdviceSpans {
 public:
  explicit AdviceSpans(std::uint64_t pages);
  // Applies `change` to every page of [first, last] (inclusive page numbers).
  void update(std::uint64_t first, std::uint64_t last,
              const std::function<void(PageAdvice&)>& change);
  // The advice of [first, last] as the range attributes report it: a field that differs between
  // pages reads as not set (INVALID location, read-mostly false, accessed-by the intersection).
  PageAdvice combined(std::uint64_t first, std::uint64_t last) const;
  std::size_t runs() const noexcept { return runs_.size(); }

 private:
  std::map<std::uint64_t, PageAdvice> runs_;  // first page of each run -> its advice
  std::uint64_t pages_;
};

// The advice of every live managed allocation of the process, by base address.
class ManagedAdvice {
 public:
  void add(std::uint64_t base, std::uint64_t bytes);
  void remove(std::uint64_t base);
  // Applies `change` to the pages of [address, address + bytes) of the allocation at `base`.
  void update(std::uint64_t base, std::uint64_t address, std::uint64_t bytes,
              const std::function<void(PageAdvice&)>& change);
  PageAdvice combined(std::uint64_t base, std::uint64_t address, std::uint64_t bytes) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::uint64_t, AdviceSpans> allocations_;
};
ManagedAdvice& managed_advice() noexcept;

}  // namespace mpsshim::shim

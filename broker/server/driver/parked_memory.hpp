// Page-locked host memory that a suspended client's device memory is parked in (DeviceHeap::park).
//
// How fast the server gets it decides how long a suspend takes, more than the copy does. Measured
// on an H200 host (16 cores, driver 580, 16 GiB, one run): cuMemHostRegister of fresh anonymous
// memory 3.6 GB/s, cuMemHostAlloc 2.9 GB/s; with transparent huge pages asked for (madvise) 6.1
// GB/s; with the pages also faulted in first by 16 threads 26.8 GB/s (0.30 s faulting, 0.34 s
// registering); the copy into it then runs at 55 GB/s, what bench/bandwidth measures for pinned
// memory. So the memory is mapped with huge pages asked for and is faulted in by several threads,
// a piece at a time, each piece registered on its own so that its copy runs while the next piece
// is faulted in.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <tl/expected.hpp>

#include "broker/server/driver/driver_table.hpp"

namespace mpsshim::server {

// Anonymous memory aligned to the huge page, with huge pages asked for (a 2 MiB fault instead of
// 512 small ones); null when the host has no address space for it.
void* map_huge_aligned(std::uint64_t bytes);
// Touches every page of [p, p + bytes) so that the kernel provides it now, on up to 16 threads:
// registering memory already present is what runs fast.
void fault_in(std::byte* p, std::uint64_t bytes);

// Each piece of parked memory is registered with the driver on its own.
inline constexpr std::uint64_t kParkPiece = std::uint64_t{1} << 30;

// Called for each piece once it is page-locked: `host` is the piece, `offset` its place in the
// whole; queues the piece's copy. An error stops pinning.
using ParkPieceFn = std::function<CUresult(void* host, std::uint64_t offset, std::uint64_t bytes)>;

// `bytes` of page-locked host memory, `piece` called for each piece as it is ready. On an error
// (no host memory: CUDA_ERROR_OUT_OF_MEMORY, or the driver's or `piece`'s), nothing is left held:
// the copies already queued on `stream` are waited for, then the memory is given back.
tl::expected<void*, CUresult> pin_parked(const DriverTable& cu, std::uint64_t bytes,
                                         CUstream stream, const ParkPieceFn& piece);

// Whether the host can hold `bytes` more: what /proc/meminfo calls available, and what the
// server's cgroup (v2) still allows, each less a margin. Faulting in memory the host does not have
// would bring the kernel's OOM killer to the server and all its clients instead of an error.
bool host_can_hold(std::uint64_t bytes);

// Calls `piece` for each piece of parked memory `host` of `bytes`, in order; stops at an error.
CUresult for_each_parked_piece(void* host, std::uint64_t bytes, const ParkPieceFn& piece);

// Unregisters and unmaps memory pin_parked gave.
void unpin_parked(const DriverTable& cu, void* host, std::uint64_t bytes);

// Gives parked memory back on a thread of its own, in `context`: unregistering and unmapping
// 16 GiB took 0.3 s (same H200 host), which a resumed client need not wait for. Thread-safe.
class ParkedReleaser {
 public:
  explicit ParkedReleaser(const DriverTable& cu) : cu_(cu) {}
  // Gives back what is still queued, then joins the thread.
  ~ParkedReleaser();
  ParkedReleaser(const ParkedReleaser&) = delete;
  ParkedReleaser& operator=(const ParkedReleaser&) = delete;

  void release(CUcontext context, void* host, std::uint64_t bytes);

 private:
  struct Parked {
    CUcontext context = nullptr;
    void* host = nullptr;
    std::uint64_t bytes = 0;
  };
  void run();

  const DriverTable& cu_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Parked> queue_;  // under mutex_
  bool stop_ = false;          // under mutex_
  std::thread thread_;         // started by the first release
};

}  // namespace mpsshim::server

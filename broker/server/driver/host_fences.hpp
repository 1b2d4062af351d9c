// Host fences: completion marks the GPU itself writes into pinned host memory, so the server
// learns that a client's work finished by reading a word instead of asking the driver.
//
// Why: on an H100 with driver 580 (tools/probes/green_call_costs.cpp) cuEventQuery and an idle
// cuStreamQuery each cost ~1.5 us of CPU, while cuEventRecord costs ~0.2 us. A worker that polls
// events answers a synchronizing call up to one query late and spends 1.5 us per owed answer per
// pass; a word in host memory is read in nanoseconds. A fence is one cuStreamWriteValue32 (with
// its default memory barrier, so what the stream wrote before is visible first) queued behind
// the client's work; the completion that waits on it fires when the word holds the fence's value.
//
// The write never lands if the stream's work faults (the context is then poisoned): every fence
// is paired with a pool event recorded after it, which the completion queries only when it has
// waited longer than kFaultCheckInterval, to learn of the fault (completions.cpp).
//
// Words come from pages of pinned host memory registered with the driver, one set per session,
// owned and touched only by the worker thread that owns the session. The first page is the
// session's watch page when the client takes one (open_watch_page): a sealed memfd the client
// maps read-only, so a client thread spinning for a synchronize sees its fence land and rings
// the worker, which sleeps meanwhile instead of polling (Worker::park, ResponseSlot::watch).
// The client cannot write it (F_SEAL_FUTURE_WRITE), so the server's reading of a word stays
// its own: a client could otherwise fake its fences and have memory freed under running work. A
// word is reused only once its last write has landed (reached), so a late write can never satisfy a
// newer fence; a word whose write may still be in flight when its completion is abandoned (a fault,
// a departing client) stays out of circulation until the session's streams are idle and the pages
// are freed.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tl/expected.hpp>
#include <vector>

#include "broker/server/driver/driver_table.hpp"
#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

// Every synchronize gets a host fence, unless the server is crowded (more clients than it lets
// spin, Server::crowded) and more than this many operations were queued on the stream since it
// was last known idle: then it is throughput-bound and gets only an event. A fence answers a
// synchronize sooner (the worker reads a word instead of asking the driver, ~1.5 us per query),
// but its cuStreamWriteValue32 costs ~1.9 us of driver CPU, serialized with the process's
// launches. Measured on an H100 (driver 580, 2026-11-28, tools/probes/small_kernels_ab.sh,
// 64 small kernels per synchronize, two rounds): with a fence on every synchronize 1 client
// went from 89.0 k to 90.0 k kernels/s and its stream's idle time at a synchronize from 19.3
// to 14.2 us, 8 clients from 646 k to 672 k (idle 27.3 -> 23.1 us), while 32 clients (crowded
// on 16 CPUs) fell from 1.91 M to 1.67 M. (mpsshim-server --crowded-fence-max-queued N.)
inline constexpr std::uint64_t kCrowdedFenceMaxQueued = 8;

// A waiting completion that has not fired after this long also queries its event (a fault
// stops the stream before its fence's write), and again after twice as long each time, up to
// kFaultCheckMaxInterval between two queries: a batch client's 16 ms synchronize asked every
// 200 us made four such clients' workers take the driver lock ~20,000 times a second, which the
// other workers' launches wait for; a fault is then seen at most 3.2 ms late (and at once by
// any worker's next driver call, since a fault poisons the whole context).
inline constexpr auto kFaultCheckInterval = std::chrono::microseconds(200);
inline constexpr auto kFaultCheckMaxInterval = std::chrono::microseconds(3200);
// The wait before the completion's (checks_done + 1)-th fault check.
constexpr std::chrono::microseconds fault_check_after(std::uint32_t checks_done) {
  auto interval = kFaultCheckInterval;
  for (std::uint32_t i = 0; i < checks_done && interval < kFaultCheckMaxInterval; ++i)
    interval *= 2;
  return std::min(interval, kFaultCheckMaxInterval);
}
// How often a completion with no host fence asks the driver about its event by default
// (ServerSettings::event_poll).
inline constexpr auto kDefaultEventPoll = std::chrono::microseconds(0);

struct HostFence {
  static constexpr std::uint32_t kNone = 0xffffffffu;
  std::uint32_t word = kNone;  // index into the session's words
  std::uint32_t value = 0;     // what the GPU writes there when the stream reaches the fence
  bool armed() const { return word != kNone; }
};

class HostFences {
 public:
  static constexpr std::size_t kWordsPerPage = 1024;  // one 4 KiB page of 32-bit words

  HostFences() = default;
  ~HostFences();  // the owner calls release_all first; a leftover page is only unmapped
  HostFences(const HostFences&) = delete;
  HostFences& operator=(const HostFences&) = delete;

  // Makes the first page a page of a sealed memfd and returns a descriptor the client can map
  // read-only (and only read-only). Before the first arm(); the page is registered with the
  // driver at the first arm.
  tl::expected<proto::UniqueFd, std::string> open_watch_page();
  // The fence's word is in the watch page: the client can see it land.
  bool watched(const HostFence& fence) const {
    return fence.armed() && watch_page_registered_ && fence.word < kWordsPerPage;
  }

  // Queues a fence on `stream`: the GPU writes a fresh value into a free word once the work
  // queued on the stream before it has completed.
  tl::expected<HostFence, CUresult> arm(const DriverTable& cu, CUstream stream);
  // The GPU's write has landed.
  bool reached(const HostFence& fence) const;
  // Gives a reached fence's word back.
  void release(const HostFence& fence);
  // Session end, the session's streams idle: unregisters and frees every page.
  void release_all(const DriverTable& cu);

  std::size_t words_in_use() const { return in_use_; }
  std::size_t pages() const { return pages_.size(); }

 private:
  struct Page {
    std::uint32_t* host = nullptr;
    CUdeviceptr device = 0;
  };
  CUresult add_page(const DriverTable& cu);

  // The memfd page of open_watch_page, mapped here until add_page takes it as page 0.
  std::uint32_t* watch_page_ = nullptr;
  bool watch_page_registered_ = false;
  std::vector<Page> pages_;
  std::vector<std::uint32_t> free_;        // word indexes ready for a new fence
  std::vector<std::uint32_t> last_value_;  // per word: the value of its latest fence
  std::size_t in_use_ = 0;
};

}  // namespace mpsshim::server

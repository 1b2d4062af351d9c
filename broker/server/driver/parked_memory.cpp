#include "broker/server/driver/parked_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

constexpr std::uint64_t kHugePage = std::uint64_t{2} << 20;
constexpr std::uint64_t kPage = 4096;
// Below this a piece is faulted in by the calling thread alone.
constexpr std::uint64_t kFaultInParallelFrom = std::uint64_t{64} << 20;

}  // namespace

void* map_huge_aligned(std::uint64_t bytes) {
  const std::uint64_t padded = bytes + kHugePage;
  void* raw = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) ::munmap(raw, aligned - start);
  const std::uintptr_t end = start + padded, used_end = aligned + bytes;
  if (end > used_end) ::munmap(reinterpret_cast<void*>(used_end), end - used_end);
  void* host = reinterpret_cast<void*>(aligned);
  ::madvise(host, bytes, MADV_HUGEPAGE);  // advice: without THP, small pages
  return host;
}

void fault_in(std::byte* p, std::uint64_t bytes) {
  auto touch = [](std::byte* from, std::uint64_t length) {
    for (std::uint64_t o = 0; o < length; o += kPage) {
      *reinterpret_cast<volatile std::byte*>(from + o) = std::byte{0};
    }
  };
  const unsigned threads =
      bytes < kFaultInParallelFrom ? 1u : std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  if (threads == 1) return touch(p, bytes);
  const std::uint64_t share = (bytes / threads + kHugePage - 1) & ~(kHugePage - 1);
  std::vector<std::thread> helpers;
  std::uint64_t mine = std::min(share, bytes);  // the calling thread's part
  for (unsigned i = 1; i < threads && i * share < bytes; ++i) {
    const std::uint64_t length = std::min(share, bytes - i * share);
    try {
      helpers.emplace_back(touch, p + i * share, length);
    } catch (const std::system_error&) {
      mine = bytes;  // no more threads: the rest on this one (pages touched twice cost nothing)
      break;
    }
  }
  touch(p, mine);
  for (std::thread& t : helpers) t.join();
}

namespace {

// A number from a file of the kernel's ("max" or unreadable: none).
std::uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::uint64_t value = 0;
  if (!(in >> value)) return std::numeric_limits<std::uint64_t>::max();
  return value;
}

void unregister_pieces(const DriverTable& cu, void* host, std::uint64_t registered) {
  for (std::uint64_t o = 0; o < registered; o += kParkPiece) {
    if (CUresult r = cu.cuMemHostUnregister(static_cast<std::byte*>(host) + o); r != CUDA_SUCCESS) {
      log_warn("parked memory: cuMemHostUnregister failed: {}", describe(cu, r));
    }
  }
}

}  // namespace

bool host_can_hold(std::uint64_t bytes) {
  constexpr std::uint64_t kMargin = std::uint64_t{1} << 30;
  std::uint64_t available = std::numeric_limits<std::uint64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") available = kib << 10;
  }
  // The cgroup (v2) the server runs in: "0::/path".
  std::ifstream cgroup("/proc/self/cgroup");
  for (std::string line; std::getline(cgroup, line);) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const std::uint64_t max = read_number(dir + "/memory.max");
    const std::uint64_t current = read_number(dir + "/memory.current");
    if (max != std::numeric_limits<std::uint64_t>::max() &&
        current != std::numeric_limits<std::uint64_t>::max()) {
      available = std::min(available, max > current ? max - current : 0);
    }
  }
  return available > kMargin && bytes <= available - kMargin;
}

tl::expected<void*, CUresult> pin_parked(const DriverTable& cu, std::uint64_t bytes,
                                         CUstream stream, const ParkPieceFn& piece) {
  void* host = map_huge_aligned(bytes);
  if (host == nullptr) return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  auto* base = static_cast<std::byte*>(host);
  auto length_at = [&](std::uint64_t offset) { return std::min(kParkPiece, bytes - offset); };
  std::uint64_t registered = 0;
  CUresult failed = CUDA_SUCCESS;
  fault_in(base, length_at(0));
  while (registered < bytes) {
    const std::uint64_t offset = registered, length = length_at(offset);
    // The next piece is faulted in while this one is registered and its copy queued (without a
    // thread to spare, its registration faults it in, more slowly).
    std::thread ahead;
    if (offset + length < bytes) {
      try {
        ahead = std::thread(fault_in, base + offset + length, length_at(offset + length));
      } catch (const std::system_error&) {
      }
    }
    failed = cu.cuMemHostRegister_v2(base + offset, length, 0);
    if (failed == CUDA_SUCCESS) {
      registered += length;
      failed = piece(base + offset, offset, length);
    }
    if (ahead.joinable()) ahead.join();
    if (failed != CUDA_SUCCESS) break;
  }
  if (failed == CUDA_SUCCESS) return host;
  cu.cuStreamSynchronize(stream);
  unregister_pieces(cu, host, registered);
  ::munmap(host, bytes);
  return tl::unexpected(failed);
}

CUresult for_each_parked_piece(void* host, std::uint64_t bytes, const ParkPieceFn& piece) {
  auto* base = static_cast<std::byte*>(host);
  for (std::uint64_t o = 0; o < bytes; o += kParkPiece) {
    if (CUresult r = piece(base + o, o, std::min(kParkPiece, bytes - o)); r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

void unpin_parked(const DriverTable& cu, void* host, std::uint64_t bytes) {
  unregister_pieces(cu, host, bytes);
  ::munmap(host, bytes);
}

ParkedReleaser::~ParkedReleaser() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ParkedReleaser::release(CUcontext context, void* host, std::uint64_t bytes) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(Parked{context, host, bytes});
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void ParkedReleaser::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::vector<Parked> batch;
    batch.swap(queue_);
    lock.unlock();
    for (const Parked& p : batch) {
      cu_.cuCtxSetCurrent(p.context);
      unpin_parked(cu_, p.host, p.bytes);
    }
    lock.lock();
  }
}

}  // namespace mpsshim::server

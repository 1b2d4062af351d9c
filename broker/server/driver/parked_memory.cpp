#include "broker/server/driver/parked_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
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

// Anonymous memory aligned to the huge page, with huge pages asked for: a 2 MiB fault instead of
// 512 small ones.
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

// Touches every page of [p, p + bytes) so that the kernel provides it now, on several threads:
// registering memory already present is what runs fast (parked_memory.hpp).
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
  for (unsigned i = 1; i < threads && i * share < bytes; ++i) {
    helpers.emplace_back(touch, p + i * share, std::min(share, bytes - i * share));
  }
  touch(p, std::min(share, bytes));
  for (std::thread& t : helpers) t.join();
}

void unregister_pieces(const DriverTable& cu, void* host, std::uint64_t registered) {
  for (std::uint64_t o = 0; o < registered; o += kParkPiece) {
    if (CUresult r = cu.cuMemHostUnregister(static_cast<std::byte*>(host) + o); r != CUDA_SUCCESS) {
      log_warn("parked memory: cuMemHostUnregister failed: {}", describe(cu, r));
    }
  }
}

}  // namespace

tl::expected<void*, CUresult> pin_parked(const DriverTable& cu, std::uint64_t bytes,
                                         CUstream stream, const ParkPieceFn& piece) {
  void* host = map_huge_aligned(bytes);
  if (host == nullptr) return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  auto* base = static_cast<std::byte*>(host);
  std::uint64_t registered = 0;
  CUresult failed = CUDA_SUCCESS;
  while (registered < bytes) {
    const std::uint64_t length = std::min(kParkPiece, bytes - registered);
    fault_in(base + registered, length);
    if (failed = cu.cuMemHostRegister_v2(base + registered, length, 0); failed != CUDA_SUCCESS) {
      break;
    }
    const std::uint64_t offset = registered;
    registered += length;
    if (failed = piece(base + offset, offset, length); failed != CUDA_SUCCESS) break;
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

}  // namespace mpsshim::server

#include "broker/server/driver/host_fences.hpp"

#include <sys/mman.h>

#include <atomic>

namespace mpsshim::server {

namespace {
constexpr std::size_t kPageBytes = HostFences::kWordsPerPage * sizeof(std::uint32_t);
}  // namespace

HostFences::~HostFences() {
  for (const Page& page : pages_) ::munmap(page.host, kPageBytes);
}

CUresult HostFences::add_page(const DriverTable& cu) {
  void* host =
      ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (host == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  // PORTABLE: the green contexts' streams write it, the primary context registers it.
  if (CUresult r = cu.cuMemHostRegister_v2(
          host, kPageBytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
      r != CUDA_SUCCESS) {
    ::munmap(host, kPageBytes);
    return r;
  }
  CUdeviceptr device = 0;
  if (CUresult r = cu.cuMemHostGetDevicePointer_v2(&device, host, 0); r != CUDA_SUCCESS) {
    cu.cuMemHostUnregister(host);
    ::munmap(host, kPageBytes);
    return r;
  }
  const auto first = static_cast<std::uint32_t>(pages_.size() * kWordsPerPage);
  pages_.push_back({static_cast<std::uint32_t*>(host), device});
  last_value_.resize(pages_.size() * kWordsPerPage, 0);
  // Handed out from the lowest index up.
  for (std::uint32_t i = kWordsPerPage; i-- > 0;) free_.push_back(first + i);
  return CUDA_SUCCESS;
}

tl::expected<HostFence, CUresult> HostFences::arm(const DriverTable& cu, CUstream stream) {
  if (free_.empty()) {
    if (CUresult r = add_page(cu); r != CUDA_SUCCESS) return tl::unexpected(r);
  }
  const std::uint32_t word = free_.back();
  // A value the word has never held since its last fence: the previous write has landed
  // (release), so the word holds last_value_ and the next one differs from it. 0 is skipped so
  // that a fresh page's zeros never match.
  std::uint32_t value = last_value_[word] + 1;
  if (value == 0) value = 1;
  const Page& page = pages_[word / kWordsPerPage];
  const CUdeviceptr at = page.device + (word % kWordsPerPage) * sizeof(std::uint32_t);
  if (CUresult r = cu.cuStreamWriteValue32_v2(stream, at, value, CU_STREAM_WRITE_VALUE_DEFAULT);
      r != CUDA_SUCCESS) {
    return tl::unexpected(r);
  }
  free_.pop_back();
  last_value_[word] = value;
  ++in_use_;
  return HostFence{word, value};
}

bool HostFences::reached(const HostFence& fence) const {
  const Page& page = pages_[fence.word / kWordsPerPage];
  // The GPU's write is a DMA into coherent host memory; acquire orders what the completion then
  // reads (a staged copy's bytes, written before the fence's barrier) after it.
  return std::atomic_ref<std::uint32_t>(page.host[fence.word % kWordsPerPage])
             .load(std::memory_order_acquire) == fence.value;
}

void HostFences::release(const HostFence& fence) {
  free_.push_back(fence.word);
  --in_use_;
}

void HostFences::release_all(const DriverTable& cu) {
  for (const Page& page : pages_) {
    cu.cuMemHostUnregister(page.host);
    ::munmap(page.host, kPageBytes);
  }
  pages_.clear();
  free_.clear();
  last_value_.clear();
  in_use_ = 0;
}

}  // namespace mpsshim::server

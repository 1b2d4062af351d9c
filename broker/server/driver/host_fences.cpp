#include "broker/server/driver/host_fences.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace mpsshim::server {

namespace {
constexpr std::size_t kPageBytes = HostFences::kWordsPerPage * sizeof(std::uint32_t);
}  // namespace

HostFences::~HostFences() {
  for (const Page& page : pages_) ::munmap(page.host, kPageBytes);
  if (watch_page_ != nullptr) ::munmap(watch_page_, kPageBytes);
}

tl::expected<proto::UniqueFd, std::string> HostFences::open_watch_page() {
  static_assert(kWordsPerPage == proto::kWatchPageWords);
  if (watch_page_ != nullptr || !pages_.empty()) {
    return tl::unexpected(std::string("fences are in use"));
  }
  proto::UniqueFd fd(::memfd_create("mpsshim-fences", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return tl::unexpected(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (::ftruncate(fd.get(), kPageBytes) != 0) {
    return tl::unexpected(fmt::format("ftruncate: {}", std::strerror(errno)));
  }
  void* host = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (host == MAP_FAILED) return tl::unexpected(fmt::format("mmap: {}", std::strerror(errno)));
  // This mapping stays writable; no later one can be (the client's included).
  if (::fcntl(fd.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    const int err = errno;
    ::munmap(host, kPageBytes);
    return tl::unexpected(fmt::format("sealing: {}", std::strerror(err)));
  }
  watch_page_ = static_cast<std::uint32_t*>(host);
  return fd;
}

CUresult HostFences::add_page(const DriverTable& cu) {
  void* host = nullptr;
  const bool watch_page = pages_.empty() && watch_page_ != nullptr;
  if (watch_page) {
    host = watch_page_;
  } else {
    host = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (watch_page) watch_page_ = nullptr;
  // PORTABLE: the green contexts' streams write it, the primary context registers it.
  CUdeviceptr device = 0;
  CUresult r = cu.cuMemHostRegister_v2(host, kPageBytes,
                                       CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r == CUDA_SUCCESS) {
    r = cu.cuMemHostGetDevicePointer_v2(&device, host, 0);
    if (r != CUDA_SUCCESS) cu.cuMemHostUnregister(host);
  }
  if (r != CUDA_SUCCESS) {
    ::munmap(host, kPageBytes);
    // The watch page failed: a private page instead, and nothing of the session is watched
    // (its answers are polled), rather than no host fences at all.
    return watch_page ? add_page(cu) : r;
  }
  if (watch_page) watch_page_registered_ = true;
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
  watch_page_registered_ = false;
  free_.clear();
  last_value_.clear();
  in_use_ = 0;
}

}  // namespace mpsshim::server

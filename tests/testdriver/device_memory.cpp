#include "tests/testdriver/device_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <iterator>

namespace mpsshim::testdriver {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

// Where a real GPU's allocations tend to appear in a UVA process: high, clear of the heap and of
// the libraries, so a device pointer printed in a log looks like one.
constexpr std::uintptr_t kAddressHint = 0x7e0000000000;
constexpr std::size_t kGiB = std::size_t{1} << 30;

std::size_t page_size() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}
std::size_t align_down(std::size_t v, std::size_t a) {
  return v / a * a;
}
std::size_t align_up(std::size_t v, std::size_t a) {
  return (v + a - 1) / a * a;
}

std::byte* map_none(void* hint, std::size_t size, int extra_flags) {
  void* p =
      mmap(hint, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

}  // namespace

std::byte* reserve_exactly(std::uintptr_t address, std::size_t size) {
  if (!kThreadSanitizer) {
    return map_none(reinterpret_cast<void*>(address), size, MAP_FIXED_NOREPLACE);
  }
  // TSan's mmap drops a hint outside its application ranges but keeps MAP_FIXED_NOREPLACE, so the
  // kernel maps at address 0 (as root) and TSan aborts. A bare hint asks the kernel for the same
  // (that range when it is free, or elsewhere) and TSan only drops it.
  std::byte* p = map_none(reinterpret_cast<void*>(address), size, 0);
  if (p == nullptr || reinterpret_cast<std::uintptr_t>(p) == address) return p;
  munmap(p, size);
  return nullptr;
}

DeviceMemory::~DeviceMemory() {
  if (device_range_ != nullptr) munmap(device_range_, size_);
  if (shadow_ != nullptr) munmap(shadow_, size_);
}

void DeviceMemory::reserve(std::size_t size) {
  size_ = align_up(size, page_size());
}

bool DeviceMemory::ensure_mapped() {
  if (device_range_ != nullptr) return true;
  // Devices are placed in the order the process first allocates on them (callers hold
  // State::mutex, so the order is the process's).
  static unsigned placed = 0;
  // A gigabyte of unmapped gap between devices, so running off one device's end faults.
  const std::size_t stride = align_up(size_, kGiB) + kGiB;
  const std::uintptr_t hint = kAddressHint + placed++ * stride;
  device_range_ = reserve_exactly(hint, size_);
  if (device_range_ == nullptr) device_range_ = map_none(nullptr, size_, 0);
  shadow_ = map_none(nullptr, size_, 0);
  if (device_range_ == nullptr || shadow_ == nullptr) return false;
  base_ = reinterpret_cast<std::uintptr_t>(device_range_);
  free_.emplace(0, size_);
  return true;
}

std::optional<std::uintptr_t> DeviceMemory::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > size_ || !ensure_mapped()) return std::nullopt;
  const std::size_t length = rounded(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < length) continue;
    const std::size_t offset = it->first;
    // Committing whole pages may re-protect a page a neighbour already committed: harmless.
    const std::size_t first = align_down(offset, page_size());
    const std::size_t last = align_up(offset + length, page_size());
    if (mprotect(shadow_ + first, last - first, PROT_READ | PROT_WRITE) != 0) return std::nullopt;
    const std::size_t rest = it->second - length;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + length, rest);
    used_ += length;
    return base_ + offset;
  }
  return std::nullopt;
}

void DeviceMemory::release(std::uintptr_t addr, std::size_t bytes) {
  std::size_t offset = addr - base_;
  std::size_t length = rounded(bytes);
  used_ -= length;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(offset, length);
  decommit(offset, length);
}

// Only pages wholly inside the free block: a page shared with a live neighbour keeps its bytes.
void DeviceMemory::decommit(std::size_t offset, std::size_t length) {
  const std::size_t first = align_up(offset, page_size());
  const std::size_t last = align_down(offset + length, page_size());
  if (last <= first) return;
  madvise(shadow_ + first, last - first, MADV_DONTNEED);
  mprotect(shadow_ + first, last - first, PROT_NONE);
}

}  // namespace mpsshim::testdriver

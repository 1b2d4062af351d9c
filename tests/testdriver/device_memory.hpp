// One device's memory. Device addresses come from a PROT_NONE reservation that is never made
// accessible, so host code dereferencing a device pointer faults as it does with a real GPU; the
// bytes live in a separate shadow mapping committed per allocation, reached only through the
// driver (copies, memsets, kernel bodies).
//
// Where the addresses are, as with the real driver: in order of first use in the process, not
// by ordinal. Two processes that each use one device hand out the same addresses (the real
// driver measured on two H200s: cuMemAllocAsync 0x420000000 in both), while one process using
// both devices sees them apart (unified addressing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace mpsshim::testdriver {

// PROT_NONE addresses [address, address + size), or nullptr when any of them is taken (or, under
// ThreadSanitizer, outside the ranges TSan lets a program map: such an address is not available
// there, as a taken one is not).
std::byte* reserve_exactly(std::uintptr_t address, std::size_t size);

class DeviceMemory {
 public:
  static constexpr std::size_t kAlignment = 256;

  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  // Sizes the device at `size` bytes; its addresses are reserved at its first allocation.
  void reserve(std::size_t size);

  // First fit; returns the address of `bytes` rounded up to kAlignment, committed.
  std::optional<std::uintptr_t> allocate(std::size_t bytes);
  // `bytes` as passed to allocate().
  void release(std::uintptr_t addr, std::size_t bytes);

  static std::size_t rounded(std::size_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  std::byte* host_view(std::uintptr_t addr) const { return shadow_ + (addr - base_); }
  std::size_t size() const { return size_; }
  std::size_t used() const { return used_; }

 private:
  void decommit(std::size_t offset, std::size_t length);
  // Reserves the addresses on first use; false when the host refuses.
  bool ensure_mapped();

  std::uintptr_t base_ = 0;
  std::byte* device_range_ = nullptr;
  std::byte* shadow_ = nullptr;
  std::size_t size_ = 0;
  std::size_t used_ = 0;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, coalesced
};

}  // namespace mpsshim::testdriver

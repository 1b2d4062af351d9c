// Device memory of the fake driver: a block of host memory between two inaccessible guard
// pages, mapped on demand. A client may ask the fuzzed server for tens of MiB per record; a
// zero-filled vector made every such input pay for writing all of it (page faults and memset
// were most of fuzz_ring_records' time), while untouched anonymous pages cost nothing. The
// block ends less than 256 bytes before the upper guard page, so a copy the server lets run
// past an allocation's end faults at once (as it would under AddressSanitizer's redzones,
// which do not cover mmap'd memory).
#pragma once

#include <cuda.h>

#include <cstddef>

namespace mpsshim::server::test {

class DeviceBlock {
 public:
  // A block of `bytes` (at least 1), aligned to 256 bytes as the driver's allocations are.
  // Throws std::bad_alloc when the mapping fails.
  explicit DeviceBlock(std::size_t bytes);
  DeviceBlock(DeviceBlock&& other) noexcept;
  DeviceBlock& operator=(DeviceBlock&& other) noexcept;
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  ~DeviceBlock();

  CUdeviceptr address() const { return address_; }

 private:
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  CUdeviceptr address_ = 0;
};

}  // namespace mpsshim::server::test

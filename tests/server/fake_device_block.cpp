#include "tests/server/fake_device_block.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <utility>

namespace mpsshim::server::test {

DeviceBlock::DeviceBlock(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t usable = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  const std::size_t inner = (usable + page - 1) / page * page;
  mapping_bytes_ = inner + 2 * page;
  // MAP_NORESERVE: a test may ask for more than the machine would commit; only touched pages
  // are ever backed.
  void* at = ::mmap(nullptr, mapping_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
  if (at == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<std::byte*>(at);
  if (::mprotect(base + page, inner, PROT_READ | PROT_WRITE) != 0) {
    ::munmap(at, mapping_bytes_);
    throw std::bad_alloc();
  }
  mapping_ = at;
  address_ = reinterpret_cast<CUdeviceptr>(base + page + inner - usable);
}

DeviceBlock::DeviceBlock(DeviceBlock&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      address_(std::exchange(other.address_, 0)) {}

DeviceBlock& DeviceBlock::operator=(DeviceBlock&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    address_ = std::exchange(other.address_, 0);
  }
  return *this;
}

DeviceBlock::~DeviceBlock() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

}  // namespace mpsshim::server::test

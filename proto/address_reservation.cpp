#include "proto/address_reservation.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

namespace mpsshim::proto {

bool reserve_range(std::uint64_t base, std::uint64_t bytes, std::string* why) noexcept {
  void* want = reinterpret_cast<void*>(base);
  void* got = ::mmap(want, bytes, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == want) return true;
  const int error = errno;
  if (got != MAP_FAILED) ::munmap(got, bytes);  // a kernel that treats NOREPLACE as a hint
  if (why) *why = got == MAP_FAILED ? std::strerror(error) : "placed elsewhere";
  return false;
}

bool return_to_reservation(void* address, std::uint64_t bytes) noexcept {
  return ::mmap(address, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                -1, 0) == address;
}

}  // namespace mpsshim::proto

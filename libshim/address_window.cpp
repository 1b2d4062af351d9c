#include "libshim/address_window.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "libshim/log.hpp"
#include "proto/address_arenas.hpp"

namespace mpsshim::shim {
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

}  // namespace

bool reserve_device_window() noexcept {
  // ThreadSanitizer's mmap drops a hint outside its application ranges but keeps
  // MAP_FIXED_NOREPLACE, which would then map at address 0.
  if (kThreadSanitizer) {
    log(Level::info, "device address window not reserved: ThreadSanitizer build");
    return false;
  }
  void* want = reinterpret_cast<void*>(proto::kArenaWindowBase);
  void* got = mmap(want, proto::kArenaWindowBytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == want) return true;
  const int error = errno;
  if (got != MAP_FAILED) munmap(got, proto::kArenaWindowBytes);  // a kernel without NOREPLACE
  log(Level::warn,
      "could not reserve the device address window {:#x} + {} TiB ({}): a host allocation of this "
      "process may take an address a GPU uses, and copies would then mistake one for the other",
      proto::kArenaWindowBase, proto::kArenaWindowBytes >> 40,
      got == MAP_FAILED ? std::strerror(error) : "placed elsewhere");
  return false;
}

}  // namespace mpsshim::shim

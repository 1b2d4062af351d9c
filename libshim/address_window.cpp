#include "libshim/address_window.hpp"

#include <string>

#include "common/log.hpp"
#include "proto/address_arenas.hpp"
#include "proto/address_reservation.hpp"

namespace mpsshim::shim {
namespace {

bool g_pinned_window = false;  // written once under cuInit's lock, before any allocation

}  // namespace

void reserve_address_windows() noexcept {
  std::string why;
  if (!proto::reserve_range(proto::kArenaWindowBase, proto::kArenaWindowBytes, &why)) {
    log_warn(
        "could not reserve the device address window {:#x} + {} ({}): a host allocation of "
        "this process may take an address a GPU uses, and copies would then mistake one for the "
        "other",
        proto::kArenaWindowBase, format_bytes(proto::kArenaWindowBytes), why);
  }
  g_pinned_window = proto::reserve_range(proto::kPinnedWindowBase, proto::kPinnedWindowBytes, &why);
  if (!g_pinned_window) {
    log_info(
        "pinned host memory not placed in the shared window {:#x} + {} ({}): a kernel given "
        "the host pointer of cuMemHostAlloc memory (not cuMemHostGetDevicePointer's) may fault",
        proto::kPinnedWindowBase, format_bytes(proto::kPinnedWindowBytes), why);
  }
}

bool pinned_window_reserved() noexcept {
  return g_pinned_window;
}

}  // namespace mpsshim::shim

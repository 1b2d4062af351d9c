// The client's side of the one address space (proto/address_arenas.hpp). At cuInit the client
// reserves PROT_NONE the window of every GPU's arena, so that no host allocation of the process
// (malloc, mmap, a library) ever takes an address a GPU's server hands out as a device address
// (a unified-addressing copy or cuPointerGetAttribute then tells device from host memory by the
// address alone, as with the real driver), and the pinned window, where its cuMemHostAlloc
// memory is mapped at the address its server chose and mapped too (memory.cpp).
#pragma once

namespace mpsshim::shim {

// Once per process (a forked child inherits the reservations). A window that is taken or may
// not be mapped (RLIMIT_AS) is logged; the shim works on.
void reserve_address_windows() noexcept;

// Whether the pinned window is this process's: cuMemHostAlloc then maps where the server says.
bool pinned_window_reserved() noexcept;

}  // namespace mpsshim::shim

// The client's side of the one device address space (proto/address_arenas.hpp): the window of
// every GPU's arena is reserved PROT_NONE in the client's own address space at cuInit, so that
// no host allocation of the process (malloc, mmap, a library) ever takes an address that a GPU's
// server hands out as a device address. A unified-addressing copy or cuPointerGetAttribute can
// then tell device from host memory by the address alone, as with the real driver.
#pragma once

namespace mpsshim::shim {

// Once per process (a forked child inherits it). False, logged, when the window is taken or the
// process may not map it (RLIMIT_AS, ThreadSanitizer's address layout); the shim works on.
bool reserve_device_window() noexcept;

}  // namespace mpsshim::shim

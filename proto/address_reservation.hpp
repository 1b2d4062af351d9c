// Fixed ranges of a process's virtual address space held PROT_NONE, so that nothing else of the
// process (malloc, a library's mmap, the driver) ever lands there: the windows of
// proto/address_arenas.hpp, reserved by every client and every server.
#pragma once

#include <cstdint>
#include <string>

namespace mpsshim::proto {

// Reserves [base, base + bytes) PROT_NONE, never replacing a mapping. False with the reason in
// `why` when part of it is taken or the process may not map it (RLIMIT_AS). Under ThreadSanitizer
// the range must lie inside TSan's application ranges (the windows of a TSan build do): its mmap
// would put a MAP_FIXED_NOREPLACE range outside them at address 0 and abort.
bool reserve_range(std::uint64_t base, std::uint64_t bytes, std::string* why) noexcept;

// Turns a mapping inside a reserved range back into reservation (PROT_NONE, no memory), so the
// range stays the process's own instead of becoming a hole another mmap could take.
bool return_to_reservation(void* address, std::uint64_t bytes) noexcept;

}  // namespace mpsshim::proto

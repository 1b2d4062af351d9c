// Looking at memory the traced process may not be able to read, without faulting.
#pragma once

#include <cstddef>
#include <cstdint>

namespace darktrace {

// Copies up to `n` bytes at `address` into `out` through process_vm_readv on this process (the
// kernel reports an unmapped or unreadable page as an error instead of a fault). Returns the
// number of bytes copied: fewer than `n` when the range runs into an unreadable page, 0 when
// the first byte is unreadable.
std::size_t peek(std::uintptr_t address, unsigned char* out, std::size_t n);

// True when `address` lies in an executable mapping of this process (/proc/self/maps): a
// private-table slot worth wrapping, as opposed to a data pointer kept as it is.
bool is_code(std::uintptr_t address);

// True for a value that could be a user-space pointer (not a small integer or flag word).
inline bool looks_like_pointer(std::uint64_t value) {
  return value >= 0x10000 && value < (std::uint64_t{1} << 47);
}

}  // namespace darktrace

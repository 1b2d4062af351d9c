// Whole reads and writes of a file descriptor (the memfds that carry images and link inputs
// between client and server): retried on EINTR and short transfers, false on an error or an
// early end.
#pragma once

#include <cstddef>

namespace mpsshim::proto {

bool write_all(int fd, const void* data, std::size_t bytes) noexcept;
// Reads `bytes` from offset 0 on, whatever the descriptor's position.
bool pread_all(int fd, void* out, std::size_t bytes) noexcept;

}  // namespace mpsshim::proto

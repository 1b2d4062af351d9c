// Maps a memfd (or any fd) with Boost.Interprocess's mapped_region, which owns the mapping and
// unmaps it on destruction. Boost maps files by name or shm object; this adapter lets it map a
// descriptor received over a socket.
#pragma once

#include <boost/interprocess/mapped_region.hpp>

#include <cstddef>
#include <optional>

namespace mpsshim::proto {

class FdMappable {
 public:
  explicit FdMappable(int fd) : fd_(fd) {}
  boost::interprocess::mapping_handle_t get_mapping_handle() const {
    return boost::interprocess::ipcdetail::mapping_handle_from_file_handle(fd_);
  }

 private:
  int fd_;
};

// Shared read-write (or read-only) mapping of `bytes` at offset 0; nullopt on failure (errno
// is left as mmap set it). Never throws.
inline std::optional<boost::interprocess::mapped_region> map_fd(int fd, std::size_t bytes,
                                                                bool writable) noexcept {
  try {
    return boost::interprocess::mapped_region(
        FdMappable(fd), writable ? boost::interprocess::read_write : boost::interprocess::read_only,
        0, bytes);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace mpsshim::proto

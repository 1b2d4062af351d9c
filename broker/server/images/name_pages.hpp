// Lists of names answered a reply at a time: a module's functions (ModuleFunctionNames), a
// library's kernels (in its load's reply, then LibraryKernelNames). Each name ends with a NUL;
// the client asks again from where a reply stopped.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <span>

namespace mpsshim::server {

struct NamePage {
  std::uint32_t count = 0;  // names written, from `first` on
  std::uint32_t bytes = 0;  // of the page used
};

// Writes the names first, first + 1, ... of `total` into `out` while whole ones fit.
// name_of(i, name) sets the i-th name and returns the driver's result. A name that does not fit
// in an empty page (no cubin symbol gets near 4 KiB) gives CUDA_ERROR_NOT_SUPPORTED and
// `too_long` its length.
template <typename NameOf>
CUresult fill_name_page(std::uint32_t first, std::uint32_t total, std::span<char> out,
                        NameOf&& name_of, NamePage& page, std::size_t& too_long) {
  page = NamePage{};
  for (std::uint32_t i = first; i < total; ++i) {
    const char* name = nullptr;
    if (CUresult r = name_of(i, name); r != CUDA_SUCCESS) return r;
    const std::size_t length = std::strlen(name) + 1;
    if (page.bytes + length > out.size()) {
      if (page.count > 0) break;
      too_long = length;
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    std::memcpy(out.data() + page.bytes, name, length);
    page.bytes += static_cast<std::uint32_t>(length);
    ++page.count;
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::server

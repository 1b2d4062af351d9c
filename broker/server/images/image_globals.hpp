// Whether a CUDA image holds state that one client session could change for another. The server
// loads an image once and hands the same CUlibrary to every session that sends identical bytes
// (for a PyTorch client that saves 1-2 GB of host memory per extra session); that is only safe
// when the image has no __device__, __constant__ or __managed__ variables, since a shared load
// would share them. The scan is conservative: whatever it does not fully understand (an unknown
// entry kind or compression, a malformed header, a cut-short buffer) reads as not shareable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace mpsshim::server {

struct GlobalsScan {
  bool shareable = false;
  // When not shareable: why, short, for a log line, e.g.
  // "entry 3 (ELF, sm_90): section .nv.global". Empty when shareable.
  std::string reason;
};

// `image`: what the client sent. Either `containers` (>= 1) fat-binary containers back to back,
// or (containers == 1) a single ELF cubin, or NUL-terminated PTX text. Every entry of every
// container is checked, whatever its architecture. Reads only inside `image`; malformed input
// is not shareable. Never throws.
// The names nvcc gives the string literals of device-side assert() and printf(): "$str",
// "$str$N" and "__unnamed_N" (assert's function name). Neither "$" nor a leading "__" is open
// to a program's own variables, and no defined program writes a string literal, so a section
// or declaration holding only these carries nothing from one session to another (PyTorch's
// kernels assert everywhere: without this most of its images could not be shared). The server
// also refuses to hand out their addresses in a shared library (cuLibraryGetGlobal).
bool is_string_literal_name(std::string_view name);

GlobalsScan scan_image_globals(std::span<const std::byte> image, std::uint32_t containers) noexcept;

}  // namespace mpsshim::server

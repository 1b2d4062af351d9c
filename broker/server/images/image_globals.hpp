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

// The compute capability of the GPU an image is loaded on. The driver loads an ELF entry of
// sm_XY only on a GPU of major X and minor >= Y (binary compatibility holds within a major
// version; sm_XYa entries load on XY alone, sm_XYf ones on the family: both inside the rule),
// and JIT-compiles a PTX entry of compute_XY for a GPU of XY or later. An entry outside these
// is never loaded on the GPU, so nothing in it can become a session's state there, and the scan
// skips it without decompressing it: PyTorch's libraries carry cubins for 6-10 architectures,
// of which an H200 loads one or two. Major 0: every entry is read, whatever its architecture.
struct DeviceArch {
  int major = 0;
  int minor = 0;
  // Whether a fat-binary entry of `kind` (1: PTX, 2: ELF) built for `arch` (10 * major +
  // minor, as the entry header gives it) can be loaded on this GPU.
  bool may_load(std::uint16_t kind, std::uint32_t arch) const;
};

// `image`: what the client sent. Either `containers` (>= 1) fat-binary containers back to back,
// or (containers == 1) a single ELF cubin, or NUL-terminated PTX text. Every entry of every
// container that `device` may load is checked (a bare cubin or PTX text always is). Reads only
// inside `image`; malformed input is not shareable. Never throws.
// The names nvcc gives the string literals of device-side assert() and printf(): "$str",
// "$str$N" and "__unnamed_N" (assert's function name). Neither "$" nor a leading "__" is open
// to a program's own variables, and no defined program writes a string literal, so a section
// or declaration holding only these carries nothing from one session to another (PyTorch's
// kernels assert everywhere: without this most of its images could not be shared). The server
// also refuses to hand out their addresses in a shared library (cuLibraryGetGlobal).
bool is_string_literal_name(std::string_view name);

GlobalsScan scan_image_globals(std::span<const std::byte> image, std::uint32_t containers,
                               DeviceArch device = {}) noexcept;

}  // namespace mpsshim::server

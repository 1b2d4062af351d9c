// Functions and kernels as the shim hands them out, and their lookups on the server.
//
// A library's kernels are handed out before the server has looked them up. PyTorch's CUDA
// runtime asks cuLibraryGetKernel for every kernel of every library it loads (16,749 lookups for
// 4,389 images when a ResNet-50 client starts with eager loading; ClientConfig::lazy_loading)
// and uses 31 of them. Each lookup was a round trip
// in which the server's driver also loaded the kernel and read its parameters (measured on an
// H200: 0.44-0.47 GiB of the server's RSS and 226-246 MiB of GPU memory for PyTorch's libraries,
// docs/benchmarks.md). So a library's load answers
// with its kernels' names (proto::LibraryLoadRep); cuLibraryGetKernel of a listed name makes a
// Function that is not looked up yet, and its first use (a launch, an attribute, a graph node,
// cuFuncLoad) looks it up: the error a lookup would give surfaces there, as it does on the real
// driver with lazy loading. A name that is not listed is looked up at once, so the answer for
// it is the server's. MPSSHIM_KERNEL_LOOKUP=eager (or CUDA_MODULE_LOADING=EAGER) turns this off.
#pragma once

#include <atomic>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "proto/ops.hpp"

namespace mpsshim::shim {

// A Function from a lookup's reply.
Function* make_function(Context* ctx, const proto::FunctionRep& reply, std::string_view name,
                        bool is_kernel);

// A named lookup (ModuleGetFunction, LibraryGetKernel, ...) of `handle` on ctx's server.
CUresult lookup(Context* ctx, proto::Op op, proto::WireHandle handle, const char* name, void* reply,
                std::size_t reply_bytes);

// Appends the `count` NUL-terminated names of a reply's page; false when it is malformed.
bool append_names(std::span<const char> page, std::uint32_t count, std::uint32_t bytes,
                  std::vector<std::string>& out);

// Keeps the names a library's load listed, fetching the ones its reply could not hold. The
// library was just shipped: library->ctx and wire are set; the caller holds library->mutex or
// has not published the library yet. A failure leaves the names unknown (each kernel is then
// looked up when asked for).
void take_kernel_names(Library* library, const proto::LibraryLoadRep& reply);

// cuLibraryGetKernel of a listed name: a kernel not looked up yet, in library->kernels. nullptr
// when the name is not listed (or no names are known). The caller holds library->mutex.
Function* listed_kernel(Library* library, std::string_view name);

// Looks a listed kernel up on the server (its first use, in the function `use`: the debug log
// says which uses look kernels up).
CUresult look_up_kernel(Function* f, const char* use);

// The same library kernel on the server of `ctx`'s GPU, when `f` (a CUkernel) belongs to another
// GPU's: the library is shipped there at its first launch on that GPU. nullptr when `f` is not a
// library's kernel (a module's function belongs to one context) or the shipping failed (`rc`).
Function* kernel_on_device(Function* f, Context* ctx, CUresult& rc);

// A library kernel for the GPU a call names (cuKernelGetAttribute's `device`): f itself when it
// is that GPU's, else its copy there (kernel_on_device, through the GPU's primary context).
Function* kernel_for_device(Function* f, int device, CUresult& rc);

// The function a call on `f` means in the calling thread: a CUkernel passed as a CUfunction
// stands for the current context's GPU, as with the real driver, whose CUkernel is
// device-independent (cudaFuncGetAttributes and cuBLAS's handle setup on a second GPU ask so);
// any other function is its own context's. nullptr with `rc` when the copy could not be made.
Function* function_here(Function* f, CUresult& rc);

// Before any use of f's wire handle or parameter layout.
inline CUresult usable(Function* f, std::source_location where = std::source_location::current()) {
  return f->looked_up.load(std::memory_order_acquire) ? CUDA_SUCCESS
                                                      : look_up_kernel(f, where.function_name());
}

}  // namespace mpsshim::shim

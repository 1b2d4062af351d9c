// CUDART_INTERFACE (6bd5fb6c…, docs/private-tables.md): every cudart copy fetches it at start-up.
// CUDA 13 runtimes call only slot 2; slots 1/6/8 serve older runtimes that registered modules
// through the table instead of cuLibraryLoadData.
#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "libshim/client_view.hpp"
#include "libshim/darkapi/fatbin_format.hpp"
#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

constexpr TableId kTable = TableId::kCudartInterface;

// Wrapper rules of §5: a v1 wrapper is its container; a v2 (device-linked) one only makes
// sense as a whole, which the shim's cuLibraryLoadData understands.
CUresult load_wrapper(CUmodule* out, const void* wrapper) noexcept {
  if (out == nullptr || wrapper == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The magic first: anything else may be shorter than a wrapper.
  if (fatbin::magic_of(wrapper) != fatbin::kWrapperMagic) return CUDA_ERROR_INVALID_IMAGE;
  const auto w = fatbin::load<fatbin::Wrapper>(wrapper, 0);
  if (w.version == fatbin::kWrapperVersionPlain) {
    if (w.data == nullptr) return CUDA_ERROR_INVALID_IMAGE;
    return cuModuleLoadData(out, w.data);
  }
  if (w.version != fatbin::kWrapperVersionLinked) return CUDA_ERROR_INVALID_IMAGE;
  CUlibrary library = nullptr;
  CUresult rc = cuLibraryLoadData(&library, wrapper, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (rc != CUDA_SUCCESS) return rc;
  // The library stays loaded for the life of the module: nothing in this table unloads either
  // (slot 7, perhaps the unregister hook, is a no-op).
  rc = cuLibraryGetModule(out, library);
  if (rc != CUDA_SUCCESS) cuLibraryUnload(library);
  return rc;
}

// cudart passes NULL, NULL, 0 for the extra arguments (ZLUDA refuses anything else and works);
// their meaning is unknown, so anything else is refused rather than ignored.
bool extras_are_default(const void* a3, const void* a4, std::uint32_t a5) noexcept {
  if (a3 == nullptr && a4 == nullptr && a5 == 0) return true;
  log_warn("dark API {}: module load with unknown extra arguments ({}, {}, {}) refused",
           table_name(kTable), a3, a4, a5);
  return false;
}

CUresult get_module_from_cubin(CUmodule* out, const void* wrapper) noexcept {
  return load_wrapper(out, wrapper);
}

// Device's primary context handle, neither retained nor made current (measured, §2.1).
CUresult get_primary_ctx(CUcontext* out, CUdevice device) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return primary_context_handle(device, out);
}

CUresult get_module_from_cubin_ext1(CUmodule* out, const void* wrapper, void* a3, void* a4,
                                    std::uint32_t a5) noexcept {
  if (out == nullptr || wrapper == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!extras_are_default(a3, a4, a5)) return CUDA_ERROR_NOT_SUPPORTED;
  return load_wrapper(out, wrapper);
}

// Perhaps a module-unregister hook; doing nothing at worst leaks a module until exit.
void slot7_noop(std::uintptr_t) noexcept {}

// As slot 6, but given the container itself, and the output second.
CUresult get_module_from_cubin_ext2(const void* container, CUmodule* out, void* a3, void* a4,
                                    std::uint32_t a5) noexcept {
  if (out == nullptr || container == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!extras_are_default(a3, a4, a5)) return CUDA_ERROR_NOT_SUPPORTED;
  return cuModuleLoadData(out, container);
}

// The real driver loads its PTX compiler, libnvvm and tile-IR support here; the shim's
// compilers live in the broker's driver.
CUresult load_compilers() noexcept {
  return CUDA_SUCCESS;
}

struct CudartInterfaceTable {
  std::size_t size;
  CUresult (*get_module_from_cubin)(CUmodule*, const void*) noexcept;
  CUresult (*get_primary_ctx)(CUcontext*, CUdevice) noexcept;
  std::array<SlotFn, 3> unknown_3_5;
  CUresult (*get_module_from_cubin_ext1)(CUmodule*, const void*, void*, void*,
                                         std::uint32_t) noexcept;
  void (*slot7)(std::uintptr_t) noexcept;
  CUresult (*get_module_from_cubin_ext2)(const void*, CUmodule*, void*, void*,
                                         std::uint32_t) noexcept;
  SlotFn unknown_9;
  SlotFn null_10;  // NULL in the real driver too
  SlotFn unknown_11;
  CUresult (*load_compilers)() noexcept;
};
constexpr std::size_t kSlots = 13;
static_assert(sizeof(CudartInterfaceTable) == kSlots * sizeof(void*));
static_assert(offsetof(CudartInterfaceTable, get_module_from_cubin_ext1) == 6 * sizeof(void*));
static_assert(offsetof(CudartInterfaceTable, null_10) == 10 * sizeof(void*));

constinit const CudartInterfaceTable kCudartInterface{
    table_size_word(kSlots),
    &get_module_from_cubin,
    &get_primary_ctx,
    trap_slots<kTable, 3, 3>(),
    &get_module_from_cubin_ext1,
    &slot7_noop,
    &get_module_from_cubin_ext2,
    &trap_slot<kTable, 9>,
    nullptr,
    &trap_slot<kTable, 11>,
    &load_compilers,
};

}  // namespace

const void* cudart_interface_table() noexcept {
  return &kCudartInterface;
}

}  // namespace mpsshim::shim::darkapi

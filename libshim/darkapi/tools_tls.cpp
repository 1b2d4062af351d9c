// TOOLS_TLS (42d85a81…, docs/private-tables.md): NVIDIA's cuBLASLt reads the calling thread's
// current context through slot 2 and hands it to TOOLS_CONTEXT slot 4. A static cudart aborts
// before main without the table.
#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "libshim/client_view.hpp"
#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

// Probing showed slot 1 bumping a byte of its argument; nothing was seen calling it, and a
// success that writes nothing is the safest guess.
CUresult slot1_noop() noexcept {
  return CUDA_SUCCESS;
}

// The second argument (0, 0x37, 0x42, 0xb seen) did not change the real driver's answer.
CUresult get_current_ctx(CUcontext* out, std::uintptr_t) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = current_context();
  return CUDA_SUCCESS;
}

struct ToolsTlsTable {
  std::size_t size;
  SlotFn slot1;
  CUresult (*get_current_ctx)(CUcontext*, std::uintptr_t) noexcept;
};
constexpr std::size_t kSlots = 3;
static_assert(sizeof(ToolsTlsTable) == kSlots * sizeof(void*));

constinit const ToolsTlsTable kToolsTls{table_size_word(kSlots), &slot1_noop, &get_current_ctx};

}  // namespace

const void* tools_tls_table() noexcept {
  return &kToolsTls;
}

}  // namespace mpsshim::shim::darkapi

// CONTEXT_CHECKS (263e8860…, docs/private-tables.md): cudart, cuBLAS, cuBLASLt and CuPy call slot
// 2 with the current context and slot 3 once at start-up. The checks test bits that are never
// observably set, so both report "nothing to see".
#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "libshim/client_view.hpp"
#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

constexpr TableId kTable = TableId::kContextChecks;

// NULL ctx means the current one; with none the real driver answers 201 and writes nothing.
// *out2 is never written by the real driver.
CUresult ctx_check(CUcontext ctx, std::uint32_t* out1, void** /*out2*/) noexcept {
  if (ctx == nullptr && current_context() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (out1 != nullptr) *out1 = 0;
  return CUDA_SUCCESS;
}

// Called with a runtime-internal object; the real driver returns 0.
std::uint32_t check_fn3(void*) noexcept {
  return 0;
}

struct ContextChecksTable {
  std::size_t size;
  SlotFn slot1;
  CUresult (*ctx_check)(CUcontext, std::uint32_t*, void**) noexcept;
  std::uint32_t (*check_fn3)(void*) noexcept;
  std::array<SlotFn, 11> unknown_4_14;
};
constexpr std::size_t kSlots = 15;
static_assert(sizeof(ContextChecksTable) == kSlots * sizeof(void*));

constinit const ContextChecksTable kContextChecks{
    table_size_word(kSlots),     &trap_slot<kTable, 1>, &ctx_check, &check_fn3,
    trap_slots<kTable, 4, 11>(),
};

}  // namespace

const void* context_checks_table() noexcept {
  return &kContextChecks;
}

}  // namespace mpsshim::shim::darkapi

// TOOLS_CONTEXT (21318c60…, docs/private-tables.md): NVIDIA's cuBLASLt and cuFFT ask it for a
// context's device ordinal and unique id (slots 3 and 4, hundreds of calls per run); without
// the table cublasLtMatmulAlgoGetHeuristic answers NOT_SUPPORTED. The other 88 slots are traps.
#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "libshim/client_view.hpp"
#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

constexpr TableId kTable = TableId::kToolsContext;

// NULL does not mean "current" here (201, no write). A handle that is no live context crashes
// the real driver; the shim can tell, and says 400.
CUresult ctx_get_device(CUcontext ctx, std::int32_t* device) noexcept {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int ordinal = 0;
  std::uint64_t id = 0;
  if (!context_identity(ctx, &ordinal, &id)) return CUDA_ERROR_INVALID_HANDLE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

// The id is cuCtxGetId's; a NULL ctx has id 0 (measured).
CUresult ctx_get_id(CUcontext ctx, std::uint64_t* id) noexcept {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ctx == nullptr) {
    *id = 0;
    return CUDA_SUCCESS;
  }
  int ordinal = 0;
  std::uint64_t unique_id = 0;
  if (!context_identity(ctx, &ordinal, &unique_id)) return CUDA_ERROR_INVALID_HANDLE;
  *id = unique_id;
  return CUDA_SUCCESS;
}

// 93 slots on a 13.0 driver (595 has 95): 1-90 and 92 hold functions, 91 is NULL.
struct ToolsContextTable {
  std::size_t size;
  std::array<SlotFn, 2> unknown_1_2;
  CUresult (*ctx_get_device)(CUcontext, std::int32_t*) noexcept;
  CUresult (*ctx_get_id)(CUcontext, std::uint64_t*) noexcept;
  std::array<SlotFn, 86> unknown_5_90;
  SlotFn null_91;
  SlotFn unknown_92;
};
constexpr std::size_t kSlots = 93;
static_assert(sizeof(ToolsContextTable) == kSlots * sizeof(void*));
static_assert(offsetof(ToolsContextTable, ctx_get_device) == 3 * sizeof(void*));
static_assert(offsetof(ToolsContextTable, null_91) == 91 * sizeof(void*));

constinit const ToolsContextTable kToolsContext{
    table_size_word(kSlots),
    trap_slots<kTable, 1, 2>(),
    &ctx_get_device,
    &ctx_get_id,
    trap_slots<kTable, 5, 86>(),
    nullptr,
    &trap_slot<kTable, 92>,
};

}  // namespace

const void* tools_context_table() noexcept {
  return &kToolsContext;
}

}  // namespace mpsshim::shim::darkapi

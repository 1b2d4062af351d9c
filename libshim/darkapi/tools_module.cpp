// TOOLS_MODULE (6e163fbe…, docs/private-tables.md): cuFFT finds its kernels through it.
// After each cuModuleLoadData cuFFT calls slot 7 to walk the module's functions instead of
// asking for them by name; without the table cufftPlan* fails with CUFFT_INTERNAL_ERROR.
//
// Slot 7, learned on an H100 with driver 580 (a trace of cuFFT, then tools/probes/tools_module.cpp
// against the public cuModuleEnumerateFunctions): walk(ctx, module, callback, user) calls
// callback(user, function, mangled name) once per function of the module, in the order of
// cuModuleEnumerateFunctions, with the handles cuModuleGetFunction gives, and returns the number
// of functions. The context argument is not used (NULL and a context that is not the module's
// give the same walk); the callback's return value is ignored (it does not stop the walk). The
// shim answers from its own cuModuleEnumerateFunctions, so the handles are the shim's. What the
// real slot does with a bad module was not probed (it may crash); here it walks nothing and
// returns 0. The table has 99 slots (size word 792); the other 97 functions are traps.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

constexpr TableId kTable = TableId::kToolsModule;

using FunctionVisitor = void (*)(void* user, CUfunction function, const char* name);

std::size_t walk_functions(CUcontext, CUmodule module, FunctionVisitor visit, void* user) noexcept {
  try {
    unsigned int count = 0;
    if (cuModuleGetFunctionCount(&count, module) != CUDA_SUCCESS) return 0;
    std::vector<CUfunction> functions(count);
    if (count > 0 && cuModuleEnumerateFunctions(functions.data(), count, module) != CUDA_SUCCESS) {
      return 0;
    }
    for (CUfunction function : functions) {
      const char* name = nullptr;
      if (cuFuncGetName(&name, function) != CUDA_SUCCESS) return 0;
      if (visit != nullptr) visit(user, function, name);
    }
    return count;
  } catch (...) {
    return 0;
  }
}

// 99 slots on a 13.0 driver: 1-92 and 94-98 hold functions, 93 is NULL.
struct ToolsModuleTable {
  std::size_t size;
  std::array<SlotFn, 6> unknown_1_6;
  std::size_t (*walk_functions)(CUcontext, CUmodule, FunctionVisitor, void*) noexcept;
  std::array<SlotFn, 85> unknown_8_92;
  SlotFn null_93;
  std::array<SlotFn, 5> unknown_94_98;
};
constexpr std::size_t kSlots = 99;
static_assert(sizeof(ToolsModuleTable) == kSlots * sizeof(void*));
static_assert(offsetof(ToolsModuleTable, walk_functions) == 7 * sizeof(void*));
static_assert(offsetof(ToolsModuleTable, null_93) == 93 * sizeof(void*));

constinit const ToolsModuleTable kToolsModule{
    table_size_word(kSlots),
    trap_slots<kTable, 1, 6>(),
    &walk_functions,
    trap_slots<kTable, 8, 85>(),
    nullptr,
    trap_slots<kTable, 94, 5>(),
};

}  // namespace

const void* tools_module_table() noexcept {
  return &kToolsModule;
}

}  // namespace mpsshim::shim::darkapi

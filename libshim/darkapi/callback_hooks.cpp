// TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c…, private-tables.md): each cudart copy asks once, at
// start-up, for two process-lifetime buffers (slots 2 and 6). The other slots were never seen
// called; they succeed and write nothing.
#include <cuda.h>

#include <array>
#include <cstddef>

#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

// The unit of the reported sizes is unknown (ZLUDA allocates u32s, smolvm bytes): the buffers
// have room for 8-byte elements and report the real driver's counts.
constexpr std::size_t kBuffer1Count = 1024;
constexpr std::size_t kBuffer2Count = 14;
alignas(16) constinit std::byte buffer1[kBuffer1Count * 8]{};
alignas(16) constinit std::byte buffer2[kBuffer2Count * 8]{};

// The real functions also return the pointer (in RAX); doing the same is harmless.
void* get_buffer1(void** ptr, std::size_t* size) noexcept {
  if (ptr != nullptr) *ptr = buffer1;
  if (size != nullptr) *size = kBuffer1Count;
  return buffer1;
}

void* get_buffer2(void** ptr, std::size_t* size) noexcept {
  if (ptr != nullptr) *ptr = buffer2;
  if (size != nullptr) *size = kBuffer2Count;
  return buffer2;
}

// smolvm reports that the CUDA 12.8 runtime calls slots 1 and 4 on an ordinary path: a trap's
// NOT_SUPPORTED could fail it, success without output cannot.
CUresult hook_noop() noexcept {
  return CUDA_SUCCESS;
}

struct CallbackHooksTable {
  std::size_t size;
  SlotFn slot1;
  void* (*get_buffer1)(void**, std::size_t*) noexcept;
  SlotFn slot3;
  SlotFn slot4;
  SlotFn slot5;
  void* (*get_buffer2)(void**, std::size_t*) noexcept;
};
constexpr std::size_t kSlots = 7;
static_assert(sizeof(CallbackHooksTable) == kSlots * sizeof(void*));

constinit const CallbackHooksTable kCallbackHooks{
    table_size_word(kSlots),
    &hook_noop,
    &get_buffer1,
    &hook_noop,
    &hook_noop,
    &hook_noop,
    &get_buffer2,
};

}  // namespace

const void* callback_hooks_table() noexcept {
  return &kCallbackHooks;
}

}  // namespace mpsshim::shim::darkapi

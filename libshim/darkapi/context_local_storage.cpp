// CONTEXT_LOCAL_STORAGE (c693336e…, docs/private-tables.md): each cudart copy keeps its
// per-context state here, keyed by its own address, and looks it up on every runtime call. Served
// locally: it is hot, and the destructors are client function pointers. Semantics and error codes
// are the real driver's (measured), including the ones ZLUDA and smolvm relax.
#include <cuda.h>

#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "libshim/client_view.hpp"
#include "libshim/darkapi/tables.hpp"

namespace mpsshim::shim {
namespace {

using Destructor = void (*)(CUcontext ctx, void* key, void* value);

struct Entry {
  void* key;
  void* value;
  Destructor dtor;
};

// A context holds one entry per runtime copy in the process (a handful): a vector in insertion
// order beats a second hash level and gives the destructors a deterministic order.
using Entries = std::vector<Entry>;

struct Storage {
  std::mutex mutex;
  std::unordered_map<CUcontext, Entries> by_context;
};

// Never destroyed: runtimes may look their state up from other threads while exit() runs
// static destructors.
Storage* storage() noexcept {
  static Storage* const instance = new (std::nothrow) Storage;
  return instance;
}

// NULL means the calling thread's current context; NULL again means there is none (201).
CUcontext resolve(CUcontext ctx) noexcept {
  return ctx != nullptr ? ctx : current_context();
}

Entries::iterator find(Entries& entries, void* key) noexcept {
  auto it = entries.begin();
  while (it != entries.end() && it->key != key) ++it;
  return it;
}

CUresult cls_put(CUcontext ctx, void* key, void* value, Destructor dtor) noexcept {
  ctx = resolve(ctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Storage* s = storage();
  if (s == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  try {
    const std::scoped_lock lock(s->mutex);
    Entries& entries = s->by_context[ctx];
    // The real driver keeps the first value and refuses the second put.
    if (find(entries, key) != entries.end()) return CUDA_ERROR_INVALID_HANDLE;
    entries.push_back(Entry{key, value, dtor});
    return CUDA_SUCCESS;
  } catch (...) {  // allocation failure
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

// Removes without calling the destructor, as the real driver does.
CUresult cls_delete(CUcontext ctx, void* key) noexcept {
  ctx = resolve(ctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Storage* s = storage();
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const std::scoped_lock lock(s->mutex);
  const auto slot = s->by_context.find(ctx);
  if (slot == s->by_context.end()) return CUDA_ERROR_INVALID_HANDLE;
  const auto it = find(slot->second, key);
  if (it == slot->second.end()) return CUDA_ERROR_INVALID_HANDLE;
  slot->second.erase(it);
  if (slot->second.empty()) s->by_context.erase(slot);
  return CUDA_SUCCESS;
}

// Output first, unlike the other two. A miss leaves *value_out untouched.
CUresult cls_get(void** value_out, CUcontext ctx, void* key) noexcept {
  if (value_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ctx = resolve(ctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Storage* s = storage();
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const std::scoped_lock lock(s->mutex);
  const auto slot = s->by_context.find(ctx);
  if (slot == s->by_context.end()) return CUDA_ERROR_INVALID_HANDLE;
  const auto it = find(slot->second, key);
  if (it == slot->second.end()) return CUDA_ERROR_INVALID_HANDLE;
  *value_out = it->value;
  return CUDA_SUCCESS;
}

// No size word: [put, delete, get, NULL] (§1.1).
struct ContextLocalStorageTable {
  CUresult (*put)(CUcontext, void*, void*, Destructor) noexcept;
  CUresult (*del)(CUcontext, void*) noexcept;
  CUresult (*get)(void**, CUcontext, void*) noexcept;
  const void* end;
};
static_assert(sizeof(ContextLocalStorageTable) == 4 * sizeof(void*));

constinit const ContextLocalStorageTable kContextLocalStorage{&cls_put, &cls_delete, &cls_get,
                                                              nullptr};

}  // namespace

void run_context_local_destructors(CUcontext ctx) noexcept {
  Storage* s = storage();
  if (ctx == nullptr || s == nullptr) return;
  Entries entries;
  {
    // Cleared before any callback runs: a destructor may well call back into this table.
    const std::scoped_lock lock(s->mutex);
    const auto slot = s->by_context.find(ctx);
    if (slot == s->by_context.end()) return;
    entries = std::move(slot->second);
    s->by_context.erase(slot);
  }
  for (const Entry& e : entries) {
    if (e.dtor == nullptr) continue;
    try {
      e.dtor(ctx, e.key, e.value);
    } catch (...) {
      // A C++ runtime's callback threw through the driver; nothing above us could catch it.
      log_error("a context-local-storage destructor for context {} threw; ignored",
                static_cast<const void*>(ctx));
    }
  }
}

namespace darkapi {

const void* context_local_storage_table() noexcept {
  return &kContextLocalStorage;
}

}  // namespace darkapi
}  // namespace mpsshim::shim

// User objects: reference counts the shim keeps for the client (user_objects.hpp). A graph holds
// references through cuGraphRetainUserObject; a clone and an executable graph take a copy of
// their graph's (its embedded graphs' included); an executable graph lets go of its own after
// its last launch has run: a host function on the stream of that launch releases them, so the
// destructor never runs while a replay may still use the object.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/graph_objects.hpp"
#include "libshim/object_pool.hpp"

using namespace mpsshim::shim;

namespace mpsshim::shim {

inline constexpr std::uint32_t kUserObjectMagic = 0x55534f31;  // "USO1"

struct UserObject {
  std::uint32_t magic = kUserObjectMagic;
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  std::atomic<unsigned> refs{0};
};

namespace {

UserObject* user_object_of(CUuserObject handle) {
  return live<UserObject>(handle, kUserObjectMagic);
}

void retain(UserObject* object, unsigned count) {
  object->refs.fetch_add(count, std::memory_order_relaxed);
}

// The last reference runs the destructor on a thread of its own: the caller may hold locks the
// destructor takes (the driver's runs on an internal thread for the same reason). Releasing more
// than are held succeeds and destroys it, as the driver does (H200, driver 580).
void release(UserObject* object, unsigned count) {
  unsigned held = object->refs.load(std::memory_order_relaxed);
  unsigned left = 0;
  do {
    left = held > count ? held - count : 0;
  } while (!object->refs.compare_exchange_weak(held, left, std::memory_order_acq_rel));
  if (left != 0 || held == 0) return;
  CUhostFn destroy = object->destroy;
  void* ptr = object->ptr;
  ObjectPool<UserObject>::instance().retire(object);
  std::thread([destroy, ptr] { destroy(ptr); }).detach();
}

void CUDA_CB release_after_launch(void* data) {
  auto* refs = static_cast<UserObjectRefs*>(data);
  release_user_refs(*refs);
  delete refs;
}

}  // namespace

void retain_user_refs(const UserObjectRefs& refs) {
  for (const auto& [object, count] : refs) retain(object, count);
}

void release_user_refs(UserObjectRefs& refs) {
  for (const auto& [object, count] : refs) release(object, count);
  refs.clear();
}

void merge_user_refs(UserObjectRefs& into, const UserObjectRefs& more) {
  for (const auto& [object, count] : more) {
    bool found = false;
    for (auto& [held, held_count] : into) {
      if (held == object) {
        held_count += count;
        found = true;
      }
    }
    if (!found) into.emplace_back(object, count);
  }
}

// The references an executable graph takes when it is made: its graph's and those of every
// graph embedded in it (child graph and conditional nodes' bodies), retained once more.
void exec_take_user_refs(GraphExecObject* exec, GraphObject* graph) {
  UserObjectRefs refs;
  std::vector<GraphObject*> pending{graph};
  while (!pending.empty()) {
    GraphObject* g = pending.back();
    pending.pop_back();
    std::lock_guard lock(g->mutex);
    merge_user_refs(refs, g->user_refs);
    pending.insert(pending.end(), g->embedded.begin(), g->embedded.end());
  }
  retain_user_refs(refs);
  std::lock_guard lock(exec->mutex);
  exec->user_refs = std::move(refs);
}

void exec_release_user_refs(GraphExecObject* exec) {
  UserObjectRefs refs;
  CUstream stream = nullptr;
  bool launched = false;
  {
    std::lock_guard lock(exec->mutex);
    refs.swap(exec->user_refs);
    stream = exec->last_stream;
    launched = exec->launched;
  }
  if (refs.empty()) return;
  if (launched) {
    auto* held = new UserObjectRefs(std::move(refs));
    if (cuLaunchHostFunc(stream, release_after_launch, held) == CUDA_SUCCESS) return;
    // The stream is gone (destroyed after the launch): its work was waited for then.
    refs = std::move(*held);
    delete held;
  }
  release_user_refs(refs);
}

}  // namespace mpsshim::shim

MPSSHIM_EXPORT CUresult CUDAAPI cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy,
                                                   unsigned int initial_refcount,
                                                   unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  // The driver requires CU_USER_OBJECT_NO_DESTRUCTOR_SYNC: nothing waits for a destructor.
  if (out == nullptr || destroy == nullptr || initial_refcount == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  UserObject* object = ObjectPool<UserObject>::instance().make();
  object->ptr = ptr;
  object->destroy = destroy;
  object->refs.store(initial_refcount, std::memory_order_relaxed);
  *out = reinterpret_cast<CUuserObject>(object);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuUserObjectRetain(CUuserObject handle, unsigned int count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  UserObject* object = user_object_of(handle);
  if (object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  retain(object, count);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuUserObjectRelease(CUuserObject handle, unsigned int count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  UserObject* object = user_object_of(handle);
  if (object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  release(object, count);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphRetainUserObject(CUgraph hgraph, CUuserObject handle,
                                                        unsigned int count, unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  UserObject* object = user_object_of(handle);
  if (graph == nullptr || object == nullptr || count == 0 ||
      (flags & ~unsigned{CU_GRAPH_USER_OBJECT_MOVE}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // MOVE hands the graph references the caller held; otherwise the graph takes new ones.
  if ((flags & CU_GRAPH_USER_OBJECT_MOVE) == 0) retain(object, count);
  std::lock_guard lock(graph->mutex);
  merge_user_refs(graph->user_refs, UserObjectRefs{{object, count}});
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph hgraph, CUuserObject handle,
                                                         unsigned int count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  UserObject* object = user_object_of(handle);
  if (graph == nullptr || object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  // More than the graph holds (or none) succeeds, as the driver answers (H200, driver 580); only
  // what it holds is let go of.
  unsigned released = 0;
  {
    std::lock_guard lock(graph->mutex);
    auto it = std::find_if(graph->user_refs.begin(), graph->user_refs.end(),
                           [&](const auto& held) { return held.first == object; });
    if (it == graph->user_refs.end()) return CUDA_SUCCESS;
    released = std::min(count, it->second);
    it->second -= released;
    if (it->second == 0) graph->user_refs.erase(it);
  }
  release(object, released);
  return CUDA_SUCCESS;
}

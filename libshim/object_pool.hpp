// Where the shim's short-lived client objects live (events, streams, graphs, their nodes,
// executable graphs): a destroyed object's
// memory goes back to its pool, not to the allocator, and the next object of that type made
// takes it. A handle the program keeps after destroying its object therefore still points at an
// object of that type: a dead one, whose magic makes every call answer
// CUDA_ERROR_INVALID_HANDLE, or a newer live one, as a real driver's recycled handle would. A
// program that creates and destroys millions of events holds only as many as were alive at once.
//
// Thread-safe: one mutex around the free list; making and retiring take it once each.
#pragma once

#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "libshim/client.hpp"

namespace mpsshim::shim {

template <typename T>
class ObjectPool {
 public:
  // A new T{args...}, in a retired object's memory when there is one.
  template <typename... Args>
  T* make(Args&&... args) {
    T* slot = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
      }
    }
    if (slot == nullptr) return new T{std::forward<Args>(args)...};
    slot->~T();
    return new (slot) T{std::forward<Args>(args)...};
  }

  // The object is dead from now on (its magic reads 0, every kind's dead value) and its memory
  // is the next one's.
  void retire(T* object) {
    object->magic = decltype(T::magic){};
    std::lock_guard lock(mutex_);
    free_.push_back(object);
  }

  // Process-wide pools, never destroyed: a handle may outlive every static destructor.
  static ObjectPool& instance() {
    static auto* pool = new ObjectPool();
    return *pool;
  }

 private:
  std::mutex mutex_;
  std::vector<T*> free_;
};

}  // namespace mpsshim::shim

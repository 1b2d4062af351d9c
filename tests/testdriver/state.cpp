#include "tests/testdriver/state.hpp"

#include <pthread.h>

#include <utility>

namespace mpsshim::testdriver {
namespace {

thread_local CUcontext t_current = nullptr;  // like the driver's, per thread

}  // namespace

State::State() {
  // CUDA does not survive fork(): a child of an initialized process gets no working driver (and
  // must not touch locks that a parent thread may have held at the fork).
  pthread_atfork(nullptr, nullptr, [] {
    State& s = state();
    if (s.initialized.load()) s.forked.store(true);
  });
}

State& state() {
  static State* const s = new State;
  return *s;
}

CUresult State::admission() const {
  if (forked.load() || !initialized.load()) return CUDA_ERROR_NOT_INITIALIZED;
  return sticky.load();
}

void State::fault(CUresult error) {
  CUresult expected = CUDA_SUCCESS;
  sticky.compare_exchange_strong(expected, error);
}

int State::live_objects() {
  if (forked.load() || !initialized.load()) return 0;
  std::lock_guard lock(mutex);
  std::size_t n = streams.size() + events.size() + libraries.size() + green_contexts.size() +
                  registrations.size() + arrays.size() + tex_objects.size() + graphs.size() +
                  graph_execs.size();
  for (const auto& [base, a] : allocations) n += a.user ? 1 : 0;
  n += static_cast<std::size_t>(live_pools(*this));
  n += static_cast<std::size_t>(live_vmm_objects(*this));
  for (const auto& [handle, m] : modules) n += m->library == nullptr ? 1 : 0;
  return static_cast<int>(n);
}

bool valid_device(const State& s, CUdevice dev) {
  return dev >= 0 && static_cast<std::size_t>(dev) < s.devices.size();
}

CurrentContext context_of(State& s, CUcontext ctx) {
  if (ctx == nullptr) return {};
  for (const auto& dev : s.devices) {
    if (dev->handle() != ctx) continue;
    if (!dev->primary.active()) return {};
    return {dev.get(), ctx, dev->primary.null_stream.get()};
  }
  auto it = s.green_by_context.find(ctx);
  if (it == s.green_by_context.end()) return {};
  GreenContext* green = s.green_contexts.get(it->second);
  return {s.devices[static_cast<std::size_t>(green->device)].get(), ctx,
          green->default_stream.get()};
}

CurrentContext current_context(State& s) {
  return context_of(s, t_current);
}

void set_current_context(CUcontext ctx) {
  t_current = ctx;
}

std::byte* resolve_range_locked(State& s, std::uintptr_t addr, std::size_t bytes) {
  if (addr + bytes < addr) return nullptr;
  auto alloc = s.allocations.upper_bound(addr);
  if (alloc != s.allocations.begin()) {
    --alloc;
    if (addr + bytes <= alloc->first + alloc->second.size) {
      return s.devices[static_cast<std::size_t>(alloc->second.device)]->memory.host_view(addr);
    }
  }
  if (std::byte* mapped = resolve_mapped_locked(s, addr, bytes)) return mapped;
  // Registered host memory is device-accessible at its own address (UVA).
  auto reg = s.registrations.upper_bound(addr);
  if (reg != s.registrations.begin()) {
    --reg;
    if (addr + bytes <= reg->first + reg->second.size) return reinterpret_cast<std::byte*>(addr);
  }
  return nullptr;
}

std::byte* resolve_range(std::uintptr_t addr, std::size_t bytes) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return resolve_range_locked(s, addr, bytes);
}

CUresult allocate(State& s, Device& dev, std::size_t bytes, bool user, CUdeviceptr* out) {
  auto addr = dev.memory.allocate(bytes);
  if (!addr) return CUDA_ERROR_OUT_OF_MEMORY;
  s.allocations.emplace(*addr, Allocation{dev.ordinal, bytes, user});
  *out = *addr;
  return CUDA_SUCCESS;
}

void release_allocation(State& s, std::uintptr_t base) {
  auto it = s.allocations.find(base);
  if (it == s.allocations.end()) return;
  forget_pool_allocation(s, base);
  s.devices[static_cast<std::size_t>(it->second.device)]->memory.release(base, it->second.size);
  s.allocations.erase(it);
}

WorkQueue::Ticket submit_work(State& s, Stream& stream, std::function<void()> work,
                              CUgraphNodeType type) {
  if (stream.capture) {
    capture_node(s, stream, type, std::move(work));
    return 0;
  }
  return stream.queue->submit([&s, work = std::move(work)] {
    if (s.sticky.load() != CUDA_SUCCESS) return;  // a faulted device runs nothing more
    std::shared_lock use(s.memory_use);
    try {
      work();
    } catch (const DeviceFault& f) {
      s.fault(f.error);
    } catch (...) {
      s.fault(CUDA_ERROR_LAUNCH_FAILED);
    }
  });
}

void retire_stream(State& s, Stream& stream) {
  stream.queue->retire();
  s.retiring.push_back({stream.device, stream.context, stream.queue});
}

void drain(State& s, int device) {
  std::vector<std::shared_ptr<WorkQueue>> queues;
  {
    std::lock_guard lock(s.mutex);
    std::erase_if(s.retiring, [](const auto& r) { return r.queue.expired(); });
    for (const auto& r : s.retiring) {
      if (device >= 0 && r.device != device) continue;
      if (auto q = r.queue.lock()) queues.push_back(std::move(q));
    }
    for (const auto& dev : s.devices) {
      if ((device < 0 || dev->ordinal == device) && dev->primary.null_stream)
        queues.push_back(dev->primary.null_stream->queue);
    }
    for (const auto& [handle, stream] : s.streams)
      if (device < 0 || stream->device == device) queues.push_back(stream->queue);
    for (const auto& [handle, green] : s.green_contexts)
      if (device < 0 || green->device == device) queues.push_back(green->default_stream->queue);
  }
  for (const auto& q : queues) q->wait_idle();
}

void drain_context(State& s, CUcontext ctx) {
  std::vector<std::shared_ptr<WorkQueue>> queues;
  int primary_of = -1;
  {
    std::lock_guard lock(s.mutex);
    for (const auto& dev : s.devices)
      if (dev->handle() == ctx) primary_of = dev->ordinal;
    auto it = s.green_by_context.find(ctx);
    if (primary_of < 0 && it != s.green_by_context.end()) {
      std::erase_if(s.retiring, [](const auto& r) { return r.queue.expired(); });
      for (const auto& r : s.retiring) {
        if (r.context != ctx) continue;
        if (auto q = r.queue.lock()) queues.push_back(std::move(q));
      }
      for (const auto& [handle, stream] : s.streams)
        if (stream->context == ctx) queues.push_back(stream->queue);
      if (GreenContext* green = s.green_contexts.get(it->second))
        queues.push_back(green->default_stream->queue);
    }
  }
  // A primary context's synchronization waits for its green contexts too (cuda.h).
  if (primary_of >= 0) return drain(s, primary_of);
  for (const auto& q : queues) q->wait_idle();
}

void destroy_module(State& s, CUmodule handle) {
  Module* m = s.modules.get(handle);
  if (m == nullptr) return;
  for (const auto& [def, fn] : m->functions) s.functions.erase(fn);
  release_allocation(s, m->global);
  s.modules.erase(handle);
}

}  // namespace mpsshim::testdriver

MPSSHIM_TESTDRIVER_EXPORT int mpsshim_testdriver_live_objects(void) {
  return mpsshim::testdriver::state().live_objects();
}

// Of those, the green contexts: a server keeps finished sessions' ones for the next sessions.
MPSSHIM_TESTDRIVER_EXPORT int mpsshim_testdriver_live_green_contexts(void) {
  mpsshim::testdriver::State& s = mpsshim::testdriver::state();
  if (s.forked.load() || !s.initialized.load()) return 0;
  std::lock_guard lock(s.mutex);
  return static_cast<int>(s.green_contexts.size());
}

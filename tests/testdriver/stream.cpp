// Streams and events. Work runs on each stream's own thread; an event record completes in stream
// order and a stream wait holds the stream until the captured record has completed.
#include <atomic>
#include <chrono>
#include <thread>
#include <type_traits>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {

CUresult resolve_stream(State& s, CUstream handle, Stream*& out) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    const CurrentContext ctx = current_context(s);
    if (ctx.device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    out = ctx.null_stream;
    return CUDA_SUCCESS;
  }
  Stream* stream = s.streams.get(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->green && stream->green->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  out = stream;
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = s.streams.get(hstream);
    if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (stream->green && stream->green->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    leave_capture(s, *stream);
    retire_stream(s, *stream);  // queued work still runs, as documented
    s.streams.erase(hstream);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (CUresult r = forbid_in_capture(s, *stream); r != CUDA_SUCCESS) return r;
    if (!stream->queue->reached(stream->queue->last_submitted())) return CUDA_ERROR_NOT_READY;
    return s.sticky.load();
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hstream) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (CUresult r = forbid_in_capture(s, *stream); r != CUDA_SUCCESS) return r;
    std::shared_ptr<WorkQueue> queue = stream->queue;
    lock.unlock();
    queue->wait_idle();
    return s.sticky.load();  // a fault while waiting is this call's error too
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream hstream, CUevent hevent,
                                                             unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    std::shared_ptr<Event> event = s.events.shared(hevent);
    if (!event) return CUDA_ERROR_INVALID_HANDLE;
    if (flags != CU_EVENT_WAIT_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = capture_wait(s, *stream, *event); r != CUDA_ERROR_NOT_FOUND) return r;
    const std::uint64_t generation = event->latest();
    if (generation == 0) return CUDA_SUCCESS;  // never recorded: an empty set of work
    stream->queue->submit([event, generation] { event->wait(generation); });
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return entry([&](State& s) {
    if (inject_failure("cuEventCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    const CurrentContext ctx = current_context(s);
    if (ctx.device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    constexpr unsigned kKnown =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == nullptr || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0)
      return CUDA_ERROR_INVALID_VALUE;
    *phEvent = s.events.add(std::make_shared<Event>(ctx.device->ordinal, ctx.handle, Flags));
    return CUDA_SUCCESS;
  });
}

// Pending records still complete: the stream holds its own reference.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent hevent) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (s.events.get(hevent) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    s.captured_events.erase(s.events.get(hevent));
    s.events.erase(hevent);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuEventRecordWithFlags(CUevent hevent, CUstream hstream,
                                                                  unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    std::shared_ptr<Event> event = s.events.shared(hevent);
    // cuda.h says the event and the stream must be of one context, but green contexts share
    // their device's primary context: an H200's driver (580) records an event of the primary
    // context, or of another green context, on a green context's stream
    // (tools/probes/green_nested.cu). Of another device, never.
    if (!event || event->device() != stream->device) return CUDA_ERROR_INVALID_HANDLE;
    // CU_EVENT_RECORD_EXTERNAL is invalid outside stream capture.
    if (flags != CU_EVENT_RECORD_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
    if (stream->capture) {  // a record in a capture marks a point that other streams may join
      s.captured_events[event.get()] = CapturedRecord{stream->capture, stream->capture_tail};
      return CUDA_SUCCESS;
    }
    s.captured_events.erase(event.get());
    const std::uint64_t generation = event->capture();
    // Complete only once the stream counts the record as done: whoever saw the event complete
    // then finds the stream idle too (cuStreamQuery right after cuEventSynchronize).
    stream->queue->submit([] {}, [event, generation] { event->complete(generation); });
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuEventQuery(CUevent hevent) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Event* event = s.events.get(hevent);
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // "attempting cuEventQuery on an event that was last recorded inside a capture sequence"
    if (auto it = s.captured_events.find(event);
        it != s.captured_events.end() && !it->second.capture.expired())
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return event->reached(event->latest()) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds,
                                                                 CUevent hStart, CUevent hEnd) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Event* start = s.events.get(hStart);
    Event* end = s.events.get(hEnd);
    if (start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (((start->flags() | end->flags()) & CU_EVENT_DISABLE_TIMING) != 0)
      return CUDA_ERROR_INVALID_HANDLE;
    if (start->latest() == 0 || end->latest() == 0) return CUDA_ERROR_INVALID_HANDLE;
    const auto t0 = start->timestamp();
    const auto t1 = end->timestamp();
    if (!t0 || !t1) return CUDA_ERROR_NOT_READY;
    *pMilliseconds = std::chrono::duration<float, std::milli>(*t1 - *t0).count();
    return CUDA_SUCCESS;
  });
}

// Stream attributes: stored per stream; the ids a stream takes (cuda.h's CU_STREAM_ATTRIBUTE_*),
// anything else CUDA_ERROR_INVALID_VALUE. An access policy window must lie in device memory.
bool stream_attribute(CUstreamAttrID id) {
  return id == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW ||
         id == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY || id == CU_STREAM_ATTRIBUTE_PRIORITY ||
         id == CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP || id == CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN;
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamGetAttribute(CUstream hstream, CUstreamAttrID id,
                                                                CUstreamAttrValue* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (value == nullptr || !stream_attribute(id)) return CUDA_ERROR_INVALID_VALUE;
    auto it = stream->attributes.find(id);
    *value = it == stream->attributes.end() ? CUstreamAttrValue{} : it->second;
    if (id == CU_STREAM_ATTRIBUTE_PRIORITY) value->priority = stream->priority;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamSetAttribute(CUstream hstream, CUstreamAttrID id,
                                                                const CUstreamAttrValue* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (value == nullptr || !stream_attribute(id)) return CUDA_ERROR_INVALID_VALUE;
    if (id == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW &&
        !window_in_memory(s, value->accessPolicyWindow)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    stream->attributes[id] = *value;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamCopyAttributes(CUstream dst, CUstream src) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* to = nullptr;
    Stream* from = nullptr;
    if (CUresult r = resolve_stream(s, dst, to); r != CUDA_SUCCESS) return r;
    if (CUresult r = resolve_stream(s, src, from); r != CUDA_SUCCESS) return r;
    to->attributes = from->attributes;
    return CUDA_SUCCESS;
  });
}

namespace {

// Whether a stream wait's condition holds for `seen` (cuda.h's CUstreamWaitValue_flags).
template <typename T>
bool wait_satisfied(T seen, T value, unsigned condition) {
  switch (condition) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      // Cyclic comparison, as the driver documents: (int)(seen - value) >= 0.
      return static_cast<std::make_signed_t<T>>(seen - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return seen == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (seen & value) != 0;
    default:  // CU_STREAM_WAIT_VALUE_NOR
      return ~(seen | value) != 0;
  }
}

// A stream memory operation's store or wait, checked now (flags, alignment, memory the device
// reaches), run later in stream order. A wait blocks its stream (only) until another stream, a
// kernel or the host writes what it waits for, or the device faults.
template <typename T>
CUresult value_op_work(State& s, CUdeviceptr addr, T value, unsigned flags, bool wait,
                       std::function<void()>& out) {
  const unsigned allowed = wait ? 0x3u | unsigned{CU_STREAM_WAIT_VALUE_FLUSH}
                                : unsigned{CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER};
  if ((flags & ~allowed) != 0 || addr % sizeof(T) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (resolve_range_locked(s, addr, sizeof(T)) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  out = [=, &s] {
    std::byte* at = resolve_range(addr, sizeof(T));
    if (at == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
    std::atomic_ref<T> word(*reinterpret_cast<T*>(at));
    if (!wait) {
      word.store(value, std::memory_order_release);
      return;
    }
    while (!wait_satisfied<T>(word.load(std::memory_order_acquire), value, flags & 0x3u)) {
      if (s.sticky.load() != CUDA_SUCCESS) return;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  };
  return CUDA_SUCCESS;
}

template <typename T>
CUresult stream_mem_op(CUstream hstream, CUdeviceptr addr, T value, unsigned flags, bool wait) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    std::function<void()> work;
    if (CUresult r = value_op_work<T>(s, addr, value, flags, wait, work); r != CUDA_SUCCESS) {
      return r;
    }
    submit_work(s, *stream, std::move(work), CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult mpsshim::testdriver::mem_op_work(State& s, const CUstreamBatchMemOpParams& op,
                                          std::function<void()>& out) {
  switch (op.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      return value_op_work<cuuint32_t>(s, op.waitValue.address, op.waitValue.value,
                                       op.waitValue.flags, true, out);
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      return value_op_work<cuuint64_t>(s, op.waitValue.address, op.waitValue.value64,
                                       op.waitValue.flags, true, out);
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      return value_op_work<cuuint32_t>(s, op.writeValue.address, op.writeValue.value,
                                       op.writeValue.flags, false, out);
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      return value_op_work<cuuint64_t>(s, op.writeValue.address, op.writeValue.value64,
                                       op.writeValue.flags, false, out);
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
    case CU_STREAM_MEM_OP_BARRIER:
      // Order nothing more than work that runs one item at a time already does.
      out = [] {};
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream hstream,
                                                                   CUdeviceptr addr,
                                                                   cuuint64_t value,
                                                                   unsigned int flags) {
  return stream_mem_op<cuuint64_t>(hstream, addr, value, flags, false);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream hstream,
                                                                  CUdeviceptr addr,
                                                                  cuuint32_t value,
                                                                  unsigned int flags) {
  return stream_mem_op<cuuint32_t>(hstream, addr, value, flags, true);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream hstream,
                                                                  CUdeviceptr addr,
                                                                  cuuint64_t value,
                                                                  unsigned int flags) {
  return stream_mem_op<cuuint64_t>(hstream, addr, value, flags, true);
}

// Only the operations without an address run here (flush and barrier order nothing more than
// a stream of one item at a time already does); the others come one by one.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream hstream,
                                                                 unsigned int count,
                                                                 CUstreamBatchMemOpParams* ops,
                                                                 unsigned int flags) {
  if (count == 0 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    const auto op = ops[i].operation;
    if (op != CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES && op != CU_STREAM_MEM_OP_BARRIER) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    return resolve_stream(s, hstream, stream);
  });
}

// Stream memory operation: the 32-bit store happens in stream order, after the work before it
// (the default flags' fence is implied: work here runs one item at a time). The address must be
// device memory or registered host memory, 4-byte aligned.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream hstream,
                                                                   CUdeviceptr addr,
                                                                   cuuint32_t value,
                                                                   unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if ((flags & ~unsigned{CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER}) != 0 || addr % 4 != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (resolve_range_locked(s, addr, sizeof(cuuint32_t)) == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    submit_work(
        s, *stream,
        [=] {
          std::byte* at = resolve_range(addr, sizeof(cuuint32_t));
          if (at == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
          std::atomic_ref<cuuint32_t>(*reinterpret_cast<cuuint32_t*>(at))
              .store(value, std::memory_order_release);
        },
        CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
    return CUDA_SUCCESS;
  });
}

// An H200 has no decompression engine (CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK 0): its
// driver answers CUDA_ERROR_NOT_SUPPORTED before it looks at any argument and leaves errorIndex
// as it was (tools/probes/decompress_answer.cpp, driver 580).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemBatchDecompressAsync(CUmemDecompressParams*, size_t,
                                                                     unsigned int, size_t*,
                                                                     CUstream) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

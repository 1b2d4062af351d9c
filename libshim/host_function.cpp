// cuLaunchHostFunc and cuStreamAddCallback: the callback runs in this process, in stream order.
// The server queues a host function of its own on the real stream; when the stream gets there
// it publishes the callback's id in the session's callback cells (proto/segment.hpp) and waits.
// This process's callback thread (started on the first host function) runs the callback and
// reports it done, and only then does the stream go on.
#include <thread>
#include <unordered_map>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/host_function.hpp"
#include "proto/futex.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

// How often an idle callback thread checks that the server is still there.
constexpr std::uint64_t kIdleSliceNs = 100'000'000;

struct Callback {
  proto::HostFuncKind kind;
  CUhostFn fn;
  CUstreamCallback stream_fn;
  void* user_data;
  CUstream stream;  // as the caller named it, passed back to a stream callback
};

class HostCallbacks {
 public:
  explicit HostCallbacks(Session* session) : session_(session) {}

  std::uint64_t add(const Callback& callback) {
    std::lock_guard lock(mutex_);
    const std::uint64_t id = next_id_++;
    callbacks_.emplace(id, callback);
    if (!started_) {
      started_ = true;
      std::thread([this] { run(); }).detach();
    }
    return id;
  }

  void forget(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    callbacks_.erase(id);
  }

 private:
  // The callback thread. Never returns while the session lives: it sleeps on `posted`.
  void run() {
    const proto::SegmentView& view = session_->view();
    proto::HostCallbackControl* control = view.callback_control();
    const std::uint32_t cells = view.geometry.callback_cell_count;
    for (;;) {
      const std::uint32_t seen = control->posted.load(std::memory_order_acquire);
      bool ran = false;
      for (std::uint32_t i = 0; i < cells; ++i) ran |= run_cell(*view.callback_cell(i));
      if (ran) continue;
      if (session_->gone()) return;  // nothing will be asked any more
      proto::futex_wait(&control->posted, seen, kIdleSliceNs);
    }
  }

  bool run_cell(proto::HostCallbackCell& cell) {
    const std::uint32_t ticket = cell.requested.load(std::memory_order_acquire);
    if (ticket == 0 || ticket == cell.done.load(std::memory_order_acquire)) return false;
    const std::uint64_t id = cell.callback_id;
    const auto status = static_cast<CUresult>(cell.status);
    const bool keep = (cell.flags & proto::kCallbackKeep) != 0;
    Callback callback{};
    bool found = false;
    {
      std::lock_guard lock(mutex_);
      if (auto it = callbacks_.find(id); it != callbacks_.end()) {
        callback = it->second;
        found = true;
        if (!keep) callbacks_.erase(it);
      }
    }
    if (found) {
      if (callback.kind == proto::HostFuncKind::kStreamAddCallback) {
        callback.stream_fn(callback.stream, status, callback.user_data);
      } else {
        callback.fn(callback.user_data);
      }
    } else {
      log_once(unknown_id_, LogLevel::kWarn,
               "the server asked for host function {} that this process never queued; skipped", id);
    }
    cell.done.store(ticket, std::memory_order_seq_cst);
    proto::futex_wake(&cell.done);
    return true;
  }

  Session* session_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, Callback> callbacks_;
  std::uint64_t next_id_ = 1;
  bool started_ = false;
  std::atomic<bool> unknown_id_{false};
};

// One per session, never freed: the callback thread may outlive everything at exit.
HostCallbacks* callbacks_of(Session* session) {
  static std::mutex mutex;
  static auto* table = new std::unordered_map<Session*, HostCallbacks*>;
  if (session->view().geometry.callback_cell_count == 0) return nullptr;
  std::lock_guard lock(mutex);
  HostCallbacks*& entry = (*table)[session];
  if (entry == nullptr) entry = new HostCallbacks(session);
  return entry;
}

std::atomic<bool> g_no_cells_logged{false};

CUresult enqueue(CUstream handle, DefaultStream mode, const Callback& callback) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, mode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  HostCallbacks* callbacks = callbacks_of(ctx->session);
  if (callbacks == nullptr) {
    log_once(g_no_cells_logged, LogLevel::kError,
             "host functions (cuLaunchHostFunc, cuStreamAddCallback) need an mpsshim server of "
             "ABI 1.1 or later; this one has no callback cells. Update mpsshimd");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const std::uint64_t id = callbacks->add(callback);
  proto::HostFuncReq request{stream->wire, id, callback.kind, 0};
  CUresult rc = ctx->session->post(proto::Op::kHostFunc, request);
  if (rc != CUDA_SUCCESS) callbacks->forget(id);
  return rc;
}

CUresult launch_host_func(CUstream handle, CUhostFn fn, void* user_data, DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return enqueue(handle, mode,
                 Callback{proto::HostFuncKind::kLaunchHostFunc, fn, nullptr, user_data, handle});
}

CUresult add_callback(CUstream handle, CUstreamCallback fn, void* user_data, unsigned flags,
                      DefaultStream mode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (fn == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return enqueue(handle, mode,
                 Callback{proto::HostFuncKind::kStreamAddCallback, nullptr, fn, user_data, handle});
}

}  // namespace

namespace mpsshim::shim {

std::uint64_t keep_host_callback(Session* session, CUhostFn fn, void* user_data) noexcept {
  HostCallbacks* callbacks = callbacks_of(session);
  if (callbacks == nullptr) {
    log_once(g_no_cells_logged, LogLevel::kError,
             "host nodes need an mpsshim server of ABI 1.1 or later; this one has no callback "
             "cells. Update mpsshimd");
    return 0;
  }
  return callbacks->add(
      Callback{proto::HostFuncKind::kLaunchHostFunc, fn, nullptr, user_data, nullptr});
}

}  // namespace mpsshim::shim

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user_data) {
  return launch_host_func(stream, fn, user_data, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn,
                                                      void* user_data) {
  return launch_host_func(stream, fn, user_data, DefaultStream::kPerThread);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream stream, CUstreamCallback fn,
                                                    void* user_data, unsigned int flags) {
  return add_callback(stream, fn, user_data, flags, DefaultStream::kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream stream, CUstreamCallback fn,
                                                         void* user_data, unsigned int flags) {
  return add_callback(stream, fn, user_data, flags, DefaultStream::kPerThread);
}

// Contexts: primary contexts (one stable handle per device, activated on retain), created
// contexts, the per-thread current-context stack, and the client_view.hpp queries the private
// tables use. cuCtxGetDevice and cuDevicePrimaryCtxGetState are called tens of thousands of
// times per PyTorch inference: they read thread-local and atomic state only.
#include <pthread.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/object_pool.hpp"
#include "libshim/wait_policy.hpp"

namespace mpsshim::shim {

namespace {

std::array<Context, kMaxDevices>& primaries() {
  static auto* contexts = [] {
    auto* all = new std::array<Context, kMaxDevices>();
    for (int i = 0; i < kMaxDevices; ++i) {
      (*all)[i].device = i;
      (*all)[i].primary = true;
    }
    return all;
  }();
  return *contexts;
}

std::atomic<std::uint64_t> g_next_context_id{1};

// Per-thread default streams (cudaStreamPerThread, --default-stream per-thread), one per
// context the thread used. Each remembers the context's id when it was made: a primary context
// keeps its handle across a reset but its server-side streams are gone, so a stream of an
// earlier incarnation is replaced. A thread that exits gives its streams back to the server
// (sessions are never destroyed, so this is safe at any time).
struct PerThreadStream {
  Stream* stream;
  std::uint64_t ctx_id;
};
class PerThreadStreams {
 public:
  ~PerThreadStreams() {
    for (auto& [ctx, entry] : map) {
      if (current_incarnation(ctx, entry) && ctx->session->fault() == CUDA_SUCCESS) {
        ctx->session->post(proto::Op::kStreamDestroy, proto::HandleReq{entry.stream->wire});
      }
      ObjectPool<Stream>::instance().retire(entry.stream);
    }
  }
  static bool current_incarnation(Context* ctx, const PerThreadStream& entry) {
    return ctx->active.load(std::memory_order_acquire) &&
           ctx->id.load(std::memory_order_relaxed) == entry.ctx_id;
  }
  std::unordered_map<Context*, PerThreadStream> map;
};
// What each thread has of its own: its current-context stack and its per-thread default
// streams. Not a thread_local object: glibc destroys those first thing in exit(), before the
// atexit handlers and static destructors of the program's libraries run, and those still call
// the driver (cudart's teardown pushes, pops and releases contexts; PyTorch's cuFFT plan cache
// frees through the per-thread stream). Touching a destroyed map or vector there wrote into
// freed heap memory (torch.fft aborted at exit with "corrupted double-linked list"). So a
// thread_local pointer (trivially destructible, valid through all of exit) holds it, and a
// pthread key frees it when a thread ends: key destructors run after the thread's thread_local
// destructors, and never for the thread that calls exit(), whose state lives to the end.
struct ThreadState {
  std::vector<Context*> stack;
  PerThreadStreams per_thread_streams;
};
thread_local ThreadState* t_state = nullptr;

void free_thread_state(void* state) {
  t_state = nullptr;  // a later call on this thread (another key's destructor) starts afresh
  delete static_cast<ThreadState*>(state);
}

ThreadState& thread_state() {
  if (t_state != nullptr) return *t_state;
  static const pthread_key_t key = [] {
    pthread_key_t k{};
    pthread_key_create(&k, free_thread_state);
    return k;
  }();
  t_state = new ThreadState();
  pthread_setspecific(key, t_state);
  return *t_state;
}

Context* top() {
  const ThreadState* state = t_state;
  return state == nullptr || state->stack.empty() ? nullptr : state->stack.back();
}

bool valid_device(CUdevice device) {
  return device >= 0 && device < visible_device_count();
}

CUresult create_on_server(Context* ctx) {
  Session* session = nullptr;
  if (CUresult rc = session_for(ctx->device, session); rc != CUDA_SUCCESS) return rc;
  proto::CtxCreateReq request{ctx->flags.load(std::memory_order_relaxed), 0};
  proto::CtxCreateRep reply{};
  if (CUresult rc = session->call(proto::Op::kCtxCreate, request, &reply); rc != CUDA_SUCCESS) {
    return rc;
  }
  adopt_server_context(ctx, session, reply.ctx, reply.default_stream);
  return CUDA_SUCCESS;
}

// Ends the server side of a context: everything created in it is freed there.
void destroy_on_server(Context* ctx) {
  run_context_local_destructors(reinterpret_cast<CUcontext>(ctx));
  if (ctx->active.exchange(false) && ctx->session != nullptr) {
    proto::CtxReq request{ctx->wire};
    ctx->session->call(proto::Op::kCtxDestroy, request, static_cast<int*>(nullptr));
  }
  // Its streams died with it on the server; other threads notice through the context id.
  auto& streams = thread_state().per_thread_streams.map;
  if (auto it = streams.find(ctx); it != streams.end()) {
    it->second.stream->magic = Magic::kDead;
    streams.erase(it);
  }
}

}  // namespace

CUresult activate(Context* ctx) noexcept {
  if (ctx->active.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  std::lock_guard lock(ctx->mutex);
  if (ctx->active.load(std::memory_order_relaxed)) return CUDA_SUCCESS;
  return create_on_server(ctx);
}

CUresult current(Context*& out) noexcept {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = top();
  if (ctx == nullptr || ctx->magic != Magic::kContext) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult rc = activate(ctx); rc != CUDA_SUCCESS) return rc;
  out = ctx;
  return CUDA_SUCCESS;
}

unsigned current_context_flags() noexcept {
  const Context* ctx = top();
  return ctx == nullptr ? 0u : ctx->flags.load(std::memory_order_relaxed);
}

WaitPlan current_wait_plan(std::uint32_t crowded) {
  return wait_plan_for(current_context_flags(), auto_spin_total(), crowded);
}

CUresult context_for_library(Context*& out) noexcept {
  CUresult rc = current(out);
  if (rc != CUDA_ERROR_INVALID_CONTEXT) return rc;
  for (Context& primary : primaries()) {
    if (primary.primary_refs.load(std::memory_order_relaxed) <= 0) continue;
    if (activate(&primary) != CUDA_SUCCESS) continue;
    out = &primary;
    return CUDA_SUCCESS;
  }
  return rc;
}

CUresult primary_context(int device, Context*& out) noexcept {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (device < 0 || device >= visible_device_count()) return CUDA_ERROR_INVALID_DEVICE;
  Context& primary = primaries()[static_cast<std::size_t>(device)];
  if (CUresult rc = activate(&primary); rc != CUDA_SUCCESS) return rc;
  out = &primary;
  return CUDA_SUCCESS;
}

CUresult resolve_stream(CUstream handle, DefaultStream mode, Context*& ctx,
                        Stream*& stream) noexcept {
  if (handle == CU_STREAM_LEGACY || (handle == nullptr && mode == DefaultStream::kLegacy)) {
    if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
    stream = &ctx->legacy;
    return CUDA_SUCCESS;
  }
  if (handle == nullptr || handle == CU_STREAM_PER_THREAD) {
    if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
    auto& streams = thread_state().per_thread_streams.map;
    auto it = streams.find(ctx);
    if (it != streams.end()) {
      if (PerThreadStreams::current_incarnation(ctx, it->second)) {
        stream = it->second.stream;
        return CUDA_SUCCESS;
      }
      // An earlier incarnation's stream (the server's is gone with that context).
      ObjectPool<Stream>::instance().retire(it->second.stream);
      streams.erase(it);
    }
    // A blocking stream: the per-thread default stream still synchronizes with the legacy one.
    proto::StreamCreateReq request{ctx->wire, 0, 0};
    proto::StreamCreateRep reply{};
    if (CUresult rc = ctx->session->call(proto::Op::kStreamCreate, request, &reply);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    stream = ObjectPool<Stream>::instance().make();
    stream->ctx = ctx;
    stream->wire = reply.stream;
    streams.emplace(ctx, PerThreadStream{stream, ctx->id.load(std::memory_order_relaxed)});
    return CUDA_SUCCESS;
  }
  stream = object_of<Stream>(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  ctx = stream->ctx;
  if (ctx == nullptr || !ctx->active.load(std::memory_order_acquire))
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return CUDA_SUCCESS;
}

// ---- client_view.hpp ----

CUcontext current_context() noexcept {
  return reinterpret_cast<CUcontext>(top());
}

bool context_identity(CUcontext handle, int* ordinal, std::uint64_t* id) noexcept {
  Context* ctx = object_of<Context>(handle);
  if (ctx == nullptr) return false;
  if (ordinal) *ordinal = ctx->device;
  if (id) *id = ctx->id.load(std::memory_order_relaxed);
  return true;
}

CUresult primary_context_handle(CUdevice device, CUcontext* out) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  *out = reinterpret_cast<CUcontext>(&primaries()[device]);
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

// ---- primary contexts ----

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext handle = nullptr;
  primary_context_handle(dev, &handle);
  Context* ctx = object_of<Context>(handle);
  if (CUresult rc = activate(ctx); rc != CUDA_SUCCESS) return rc;
  ctx->primary_refs.fetch_add(1, std::memory_order_relaxed);
  *pctx = handle;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context& ctx = primaries()[dev];
  std::lock_guard lock(ctx.mutex);
  int refs = ctx.primary_refs.load(std::memory_order_relaxed);
  if (refs <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx.primary_refs.fetch_sub(1) == 1) destroy_on_server(&ctx);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context& ctx = primaries()[dev];
  std::lock_guard lock(ctx.mutex);
  destroy_on_server(&ctx);
  // Reset keeps the retain count: the next use recreates the context.
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  return cuDevicePrimaryCtxReset_v2(dev);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                           int* active) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  const Context& ctx = primaries()[dev];
  *flags = ctx.flags;
  *active = ctx.primary_refs.load(std::memory_order_relaxed) > 0 &&
            ctx.active.load(std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // Scheduling flags only change how a host thread waits for the server (wait_policy.hpp).
  primaries()[dev].flags.store(flags, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

// ---- created contexts ----

namespace {

CUresult create_context(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto* ctx = new Context();
  ctx->device = dev;
  ctx->flags = flags;
  if (CUresult rc = create_on_server(ctx); rc != CUDA_SUCCESS) {
    delete ctx;
    return rc;
  }
  thread_state().stack.push_back(ctx);
  *pctx = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return create_context(pctx, flags, dev);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return create_context(pctx, flags, dev);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params,
                                               int count, unsigned int flags, CUdevice dev) {
  if (count > 0 && params != nullptr) {
    log_once("cuCtxCreate_v3.affinity", LogLevel::kWarn,
             "cuCtxCreate_v3: execution-affinity parameters are ignored; use "
             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE to size the client's SM share");
  }
  return create_context(pctx, flags, dev);
}
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params,
                                               unsigned int flags, CUdevice dev) {
  if (params != nullptr &&
      (params->execAffinityParams != nullptr || params->cigParams != nullptr)) {
    log_once("cuCtxCreate_v4.params", LogLevel::kWarn,
             "cuCtxCreate_v4: affinity/CIG parameters are not supported by mpsshim");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return create_context(pctx, flags, dev);
}

void mpsshim::shim::adopt_server_context(Context* ctx, Session* session, proto::WireHandle wire,
                                         proto::WireHandle default_stream) noexcept {
  ctx->session = session;
  ctx->wire = wire;
  ctx->legacy = Stream{};
  ctx->legacy.ctx = ctx;
  ctx->legacy.wire = default_stream;
  ctx->id.store(g_next_context_id.fetch_add(1), std::memory_order_relaxed);
  ctx->active.store(true, std::memory_order_release);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = object_of<Context>(handle);
  // A green context's CUcontext goes with cuGreenCtxDestroy.
  if (ctx == nullptr || ctx->primary || ctx->green != nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return destroy_context(ctx);
}

CUresult mpsshim::shim::destroy_context(Context* ctx) noexcept {
  {
    std::lock_guard lock(ctx->mutex);
    destroy_on_server(ctx);
  }
  std::vector<Context*>& stack = thread_state().stack;
  stack.erase(std::remove(stack.begin(), stack.end(), ctx), stack.end());
  // The object stays allocated (marked dead) so a stale handle is refused, not dereferenced
  // into freed memory.
  ctx->magic = Magic::kDead;
  return CUDA_SUCCESS;
}
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
  return cuCtxDestroy_v2(ctx);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = object_of<Context>(handle);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  thread_state().stack.push_back(ctx);
  return CUDA_SUCCESS;
}
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  return cuCtxPushCurrent_v2(ctx);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  std::vector<Context*>& stack = thread_state().stack;
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = reinterpret_cast<CUcontext>(stack.back());
  stack.pop_back();
  return CUDA_SUCCESS;
}
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext* pctx) {
  return cuCtxPopCurrent_v2(pctx);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  std::vector<Context*>& stack = thread_state().stack;
  if (handle == nullptr) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  Context* ctx = object_of<Context>(handle);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) {
    stack.push_back(ctx);
  } else {
    stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(top());
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) [[unlikely]]
    return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = top();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext handle) {
  if (handle == nullptr) return cuCtxGetDevice(device);
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = object_of<Context>(handle);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = ctx->flags;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSetFlags(unsigned int flags) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  ctx->flags = flags;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetId(CUcontext handle, unsigned long long* id) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = handle ? object_of<Context>(handle) : top();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult rc = activate(ctx); rc != CUDA_SUCCESS) return rc;
  *id = ctx->id.load(std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetApiVersion(CUcontext handle, unsigned int* version) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = handle ? object_of<Context>(handle) : top();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;  // the context API version every CUDA >= 3.2 context reports
  return CUDA_SUCCESS;
}

namespace {

// A context whose last synchronize succeeded and that sent nothing since (no record of any
// context of this process: the count is the session's) is idle: every operation it queued was
// before that synchronize's record. Then no round trip (~1 us against the driver's 0.3 us): only
// what a synchronize would report anyway, an error of a one-way call or the session's fault, and
// whether the server is still there (one poll of the socket). Taken before the call, the count
// plus one is at most the count right after this synchronize's own record, so a record another
// thread sent meanwhile makes the next look miss, never wrongly succeed.
CUresult synchronize_context(Context* ctx) {
  Session& session = *ctx->session;
  const std::uint64_t before = session.records_committed();
  if (before == ctx->synced_through.load(std::memory_order_relaxed) && !session.gone()) {
    return session.take_async_error();
  }
  proto::CtxReq request{ctx->wire};
  CUresult rc = session.call(proto::Op::kCtxSynchronize, request, static_cast<int*>(nullptr));
  CUresult async = session.take_async_error();
  if (rc == CUDA_SUCCESS && async == CUDA_SUCCESS) {
    ctx->synced_through.store(before + 1, std::memory_order_relaxed);
  }
  return rc != CUDA_SUCCESS ? rc : async;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSynchronize() {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  return synchronize_context(ctx);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext handle) {
  if (handle == nullptr) return cuCtxSynchronize();
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = object_of<Context>(handle);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult rc = activate(ctx); rc != CUDA_SUCCESS) return rc;
  return synchronize_context(ctx);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  proto::CtxLimitReq request{static_cast<std::uint32_t>(limit), 0, value};
  return ctx->session->call(proto::Op::kCtxSetLimit, request, static_cast<int*>(nullptr));
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetLimit(size_t* value, CUlimit limit) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::CtxLimitReq request{static_cast<std::uint32_t>(limit), 0, 0};
  proto::CtxLimitRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kCtxGetLimit, request, &reply);
  if (rc == CUDA_SUCCESS) *value = reply.value;
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  const proto::DeviceSnapshot* snapshot = device_snapshot(ctx->device);
  if (least) *least = snapshot->stream_priority_least;
  if (greatest) *greatest = snapshot->stream_priority_greatest;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache* config) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *config = CU_FUNC_CACHE_PREFER_NONE;
  return CUDA_SUCCESS;
}

// Shared-memory bank size: fixed at four bytes on every GPU since Maxwell, which is all mpsshim
// serves; the driver answers so and takes a setting without effect, as here.
MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetSharedMemConfig(CUsharedconfig* config) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *config = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSetSharedMemConfig(CUsharedconfig config) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  return config <= CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_VALUE;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncSetSharedMemConfig(CUfunction hfunc, CUsharedconfig config) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (object_of<Function>(hfunc) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return config <= CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_VALUE;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache) {
  Context* ctx = nullptr;
  // A preference only; the primary context is shared by all clients, so it is not changed.
  return current(ctx);
}

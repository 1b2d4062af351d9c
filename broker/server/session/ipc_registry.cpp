#include "broker/server/session/ipc_registry.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

namespace mpsshim::server {

std::uint64_t random_word() {
  std::uint64_t word = 0;
  auto* at = reinterpret_cast<unsigned char*>(&word);
  std::size_t got = 0;
  while (got < sizeof(word)) {
    ssize_t n = ::getrandom(at + got, sizeof(word) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  return word;
}

// ---- IpcEvent ----

IpcEvent::~IpcEvent() {
  if (token != 0) registry_.forget_event(token);
  for (auto& [context, event] : events_) cu_.cuEventDestroy_v2(event);
}

CUevent IpcEvent::in_context(CUcontext context) {
  std::lock_guard lock(mutex_);
  for (auto& [c, event] : events_) {
    if (c == context) return event;
  }
  return nullptr;
}

void IpcEvent::adopt(CUcontext context, CUevent event) {
  std::lock_guard lock(mutex_);
  events_.emplace_back(context, event);
  if (latest_ == nullptr) latest_ = event;
}

void IpcEvent::recorded(CUevent event) {
  std::lock_guard lock(mutex_);
  latest_ = event;
}

CUevent IpcEvent::latest() {
  std::lock_guard lock(mutex_);
  return latest_;
}

// ---- IpcRegistry ----

IpcRegistry::IpcRegistry(int device) : device_(device), server_id_(random_word() | 1) {}

proto::IpcHandle IpcRegistry::make_handle(proto::IpcKind kind, std::uint64_t token, Key& key) {
  key.secret[0] = random_word();
  key.secret[1] = random_word();
  proto::IpcHandle handle{};
  handle.magic = proto::kIpcHandleMagic;
  handle.kind = static_cast<std::uint16_t>(kind);
  handle.version = proto::kIpcHandleVersion;
  handle.device = static_cast<std::uint32_t>(device_);
  handle.server_id = server_id_;
  handle.token = token;
  handle.secret[0] = key.secret[0];
  handle.secret[1] = key.secret[1];
  return handle;
}

tl::expected<std::uint64_t, IpcRefusal> IpcRegistry::check(const proto::IpcHandle& handle,
                                                           proto::IpcKind kind,
                                                           const IpcOwner& opener, const Key* key) {
  const char* what = kind == proto::IpcKind::kMemory ? "memory"
                     : kind == proto::IpcKind::kVmm  ? "VMM memory"
                                                     : "event";
  // (Reached only once the handle is known to be this server's and its token names an entry.)
  // Compared without an early exit, so the time taken says nothing about the secret.
  const std::uint64_t differs =
      (handle.secret[0] ^ key->secret[0]) | (handle.secret[1] ^ key->secret[1]);
  if (differs != 0) {
    return tl::unexpected(
        IpcRefusal{CUDA_ERROR_INVALID_HANDLE,
                   fmt::format("an IPC {} handle whose secret does not match its export (forged or "
                               "corrupted)",
                               what),
                   IpcRefusalKind::kForged});
  }
  if (key->owner.uid != opener.uid) {
    return tl::unexpected(IpcRefusal{
        CUDA_ERROR_INVALID_HANDLE,
        fmt::format("an IPC {} handle exported by uid {}: only clients of the same user may open "
                    "each other's handles (policy: docs/ipc.md)",
                    what, key->owner.uid),
        IpcRefusalKind::kOtherUser});
  }
  if (key->owner.client == opener.client && kind != proto::IpcKind::kVmm) {
    // What the driver answers a process that opens its own handle.
    return tl::unexpected(IpcRefusal{
        CUDA_ERROR_INVALID_CONTEXT,
        fmt::format("its own IPC {} handle (a process cannot open its own handle)", what),
        IpcRefusalKind::kOwn});
  }
  return handle.token;
}

namespace {

// The checks that need no entry: is this a handle of ours at all?
std::optional<IpcRefusal> foreign(const proto::IpcHandle& handle, proto::IpcKind kind, int device,
                                  std::uint64_t server_id) {
  const char* what = kind == proto::IpcKind::kMemory ? "memory"
                     : kind == proto::IpcKind::kVmm  ? "VMM memory"
                                                     : "event";
  if (handle.magic != proto::kIpcHandleMagic || handle.version != proto::kIpcHandleVersion) {
    return IpcRefusal{CUDA_ERROR_INVALID_VALUE,
                      fmt::format("an IPC {} handle that mpsshim did not make (garbage, or a "
                                  "handle of the real driver)",
                                  what),
                      IpcRefusalKind::kNotOurs};
  }
  if (handle.kind != static_cast<std::uint16_t>(kind)) {
    return IpcRefusal{CUDA_ERROR_INVALID_VALUE,
                      fmt::format("an IPC handle of another kind where a {} handle goes", what),
                      IpcRefusalKind::kNotOurs};
  }
  if (handle.device != static_cast<std::uint32_t>(device)) {
    // The shim opens a handle through the server that issued it (ipc.md, "Across GPUs"), so
    // one reaches here only from a client that does not see that GPU.
    return IpcRefusal{CUDA_ERROR_NOT_SUPPORTED,
                      fmt::format("an IPC {} handle of GPU {}'s server on GPU {}'s: the client "
                                  "does not see GPU {} (CUDA_VISIBLE_DEVICES), through whose "
                                  "server such a handle is opened",
                                  what, handle.device, device, handle.device),
                      IpcRefusalKind::kOtherGpu};
  }
  if (handle.server_id != server_id) {
    return IpcRefusal{CUDA_ERROR_INVALID_HANDLE,
                      fmt::format("an IPC {} handle of an earlier server of this GPU (it "
                                  "restarted since, and every export ended with it)",
                                  what),
                      IpcRefusalKind::kStale};
  }
  return std::nullopt;
}

IpcRefusal unknown_token(proto::IpcKind kind) {
  return kind != proto::IpcKind::kEvent
             ? IpcRefusal{CUDA_ERROR_INVALID_HANDLE,
                          "an IPC memory handle whose allocation is no longer exported (its "
                          "exporter freed it or ended), or never was",
                          IpcRefusalKind::kStale}
             : IpcRefusal{CUDA_ERROR_INVALID_HANDLE,
                          "an IPC event handle whose event no longer exists, or never did",
                          IpcRefusalKind::kStale};
}

}  // namespace

std::pair<std::shared_ptr<IpcMemory>, proto::IpcHandle> IpcRegistry::export_memory(
    CUdeviceptr base, std::uint64_t bytes, IpcOwner owner,
    std::shared_ptr<IpcReturnedBytes> charge) {
  auto memory = std::make_shared<IpcMemory>();
  memory->base = base;
  memory->bytes = bytes;
  memory->owner = owner;
  memory->charge = std::move(charge);
  std::lock_guard lock(mutex_);
  memory->token = next_token_++;
  Key key{{}, owner};
  proto::IpcHandle handle = make_handle(proto::IpcKind::kMemory, memory->token, key);
  handle.bytes = bytes;
  memory_.emplace(memory->token, std::make_pair(key, memory));
  return {memory, handle};
}

std::pair<std::shared_ptr<IpcMemory>, proto::IpcHandle> IpcRegistry::export_physical(
    proto::UniqueFd physical, std::uint64_t bytes, IpcOwner owner,
    std::shared_ptr<IpcReturnedBytes> charge) {
  auto memory = std::make_shared<IpcMemory>();
  memory->kind = proto::IpcKind::kVmm;
  memory->bytes = bytes;
  memory->owner = owner;
  memory->charge = std::move(charge);
  memory->physical = std::move(physical);
  std::lock_guard lock(mutex_);
  memory->token = next_token_++;
  Key key{{}, owner};
  proto::IpcHandle handle = make_handle(proto::IpcKind::kVmm, memory->token, key);
  handle.bytes = bytes;
  memory_.emplace(memory->token, std::make_pair(key, memory));
  return {memory, handle};
}

bool IpcRegistry::unexport_memory(IpcMemory& memory) {
  std::shared_ptr<IpcMemory> entry;  // released after the lock
  std::lock_guard lock(mutex_);
  if (auto it = memory_.find(memory.token); it != memory_.end()) {
    entry = std::move(it->second.second);
    memory_.erase(it);
  }
  memory.exporter_holds = false;
  return memory.openers == 0;
}

tl::expected<std::shared_ptr<IpcMemory>, IpcRefusal> IpcRegistry::find_memory(
    const proto::IpcHandle& handle, const IpcOwner& opener, proto::IpcKind kind) {
  if (auto refusal = foreign(handle, kind, device_, server_id_)) {
    return tl::unexpected(std::move(*refusal));
  }
  std::lock_guard lock(mutex_);
  auto it = memory_.find(handle.token);
  // A token of the other kind of memory entry is no entry of this kind.
  if (it == memory_.end() || it->second.second->kind != kind) {
    return tl::unexpected(unknown_token(kind));
  }
  if (auto ok = check(handle, kind, opener, &it->second.first); !ok) {
    return tl::unexpected(std::move(ok.error()));
  }
  return it->second.second;
}

bool IpcRegistry::add_opener(IpcMemory& memory) {
  std::lock_guard lock(mutex_);
  if (!memory.exporter_holds) return false;
  ++memory.openers;
  return true;
}

bool IpcRegistry::drop_opener(IpcMemory& memory) {
  std::lock_guard lock(mutex_);
  if (memory.openers != 0) --memory.openers;
  return memory.openers == 0 && !memory.exporter_holds;
}

void IpcRegistry::export_event(const std::shared_ptr<IpcEvent>& event, IpcOwner owner) {
  std::lock_guard lock(mutex_);
  event->token = next_token_++;
  Key key{{}, owner};
  event->handle = make_handle(proto::IpcKind::kEvent, event->token, key);
  events_.emplace(event->token, std::make_pair(key, event));
}

tl::expected<std::shared_ptr<IpcEvent>, IpcRefusal> IpcRegistry::find_event(
    const proto::IpcHandle& handle, const IpcOwner& opener) {
  if (auto refusal = foreign(handle, proto::IpcKind::kEvent, device_, server_id_)) {
    return tl::unexpected(std::move(*refusal));
  }
  std::shared_ptr<IpcEvent> event;
  {
    std::lock_guard lock(mutex_);
    auto it = events_.find(handle.token);
    if (it == events_.end()) return tl::unexpected(unknown_token(proto::IpcKind::kEvent));
    if (auto ok = check(handle, proto::IpcKind::kEvent, opener, &it->second.first); !ok) {
      return tl::unexpected(std::move(ok.error()));
    }
    event = it->second.second.lock();
  }
  // Outside the lock: if that was the last reference after all, ~IpcEvent takes it itself.
  if (!event) return tl::unexpected(unknown_token(proto::IpcKind::kEvent));
  return event;
}

void IpcRegistry::forget_event(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  events_.erase(token);
}

std::size_t IpcRegistry::memory_entries() {
  std::lock_guard lock(mutex_);
  return memory_.size();
}

std::size_t IpcRegistry::event_entries() {
  std::lock_guard lock(mutex_);
  return events_.size();
}

}  // namespace mpsshim::server

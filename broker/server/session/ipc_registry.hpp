// The interprocess handles of one server's clients (docs/ipc.md): which allocation or event a
// handle names, whose it is, and who holds it. Every client of a server shares the server's
// address space and context, so opening a handle maps nothing new: the importer is answered
// the exporter's own device address, or an event that names the same server events.
//
// Ownership: the Server owns the registry and outlives every session, which borrows it
// (Session::ipc). The sessions of one server live on different worker threads, so the entries
// and the open counts are behind one mutex, held only to find, add or remove an entry or to
// count an opener, never across a driver call. What a session exported or opened is listed in
// the session itself (Session::ipc_memory), owned by its worker.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

#include "broker/server/driver/driver_table.hpp"
#include "proto/ops_ipc.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

// Who exported an entry: the policy is that only clients of the same uid may open it.
struct IpcOwner {
  uid_t uid = 0;
  std::uint32_t client = 0;  // the exporter's client id: a process cannot open its own handle
};

// Device memory an exporter freed while others still held it open stays charged to the
// exporter until the last of them closes it. That close runs on the closer's worker, which
// only adds the bytes here; the exporter's worker gives them back at its next charge
// (MemoryCharge::take_back_returned). Shared by a session and its exports.
struct IpcReturnedBytes {
  std::atomic<std::uint64_t> bytes{0};
};

// One exported allocation. The exporter and every client that opened it hold it; the driver
// memory is freed by whoever lets go last (docs/ipc.md, *Lifetime*).
//
// Or (kind kVmm) one physical allocation shared by fd (docs/vmm.md, "Export and import"): base
// is 0 and `physical` is the driver's fd of it, which each open gets a duplicate of. Every
// opener imports that into its own server; the entry only keeps the policy and the charge.
struct IpcMemory {
  proto::IpcKind kind = proto::IpcKind::kMemory;
  CUdeviceptr base = 0;
  std::uint64_t bytes = 0;
  std::uint64_t token = 0;
  IpcOwner owner;
  std::shared_ptr<IpcReturnedBytes> charge;  // the exporter's
  proto::UniqueFd physical;                  // kVmm: the driver's fd, closed with the entry
  // Guarded by the registry's mutex.
  std::uint32_t openers = 0;   // sessions that have it open (each counts once)
  bool exporter_holds = true;  // until the exporter frees it or ends
};

// An interprocess event: what the exporter's and every importer's event name. An event
// records only on streams of its own context, and every client has a green context of its
// own, so each client that records it gets a driver event in its context; the latest record
// is what queries, synchronizes and stream waits see, as for one native event. The driver
// events live as long as the IpcEvent (bounded by the number of clients that recorded it).
class IpcRegistry;
class IpcEvent {
 public:
  IpcEvent(IpcRegistry& registry, const DriverTable& cu, unsigned flags)
      : registry_(registry), cu_(cu), flags_(flags) {}
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;
  // Destroys the driver events and forgets the handle (no later open finds it).
  ~IpcEvent();

  unsigned flags() const { return flags_; }
  // This event's driver event in `context`, or nullptr if none was made there yet.
  CUevent in_context(CUcontext context);
  // Takes `event` (made in `context`) over; it becomes the latest if there is none yet.
  void adopt(CUcontext context, CUevent event);
  // `event` (one of ours) was just recorded: waits and queries now see it.
  void recorded(CUevent event);
  CUevent latest();

  // Set once when exported (under the registry's mutex).
  std::uint64_t token = 0;
  proto::IpcHandle handle{};

 private:
  IpcRegistry& registry_;
  const DriverTable& cu_;
  const unsigned flags_;
  std::mutex mutex_;
  std::vector<std::pair<CUcontext, CUevent>> events_;
  CUevent latest_ = nullptr;
};

// Why an open was refused: the driver's answer, a sentence for the log, and which kind of
// refusal it is (the first of each kind in a session is logged at warn level).
enum class IpcRefusalKind : std::uint8_t {
  kNotOurs,    // no mpsshim handle, or a handle of the other kind
  kOtherGpu,   // a handle of another GPU's server
  kStale,      // no export of this server by that token (freed, ended, restarted server)
  kForged,     // the secret does not match
  kOtherUser,  // the policy: another uid's handle
  kOwn,        // the process's own handle
};
struct IpcRefusal {
  CUresult result;
  std::string why;
  IpcRefusalKind kind;
};

class IpcRegistry {
 public:
  // `device`: the server's GPU as mpsshimd numbers it, written into every handle.
  explicit IpcRegistry(int device);
  IpcRegistry(const IpcRegistry&) = delete;
  IpcRegistry& operator=(const IpcRegistry&) = delete;

  std::uint64_t server_id() const { return server_id_; }

  // A new export of [base, base + bytes) and the handle that names it.
  std::pair<std::shared_ptr<IpcMemory>, proto::IpcHandle> export_memory(
      CUdeviceptr base, std::uint64_t bytes, IpcOwner owner,
      std::shared_ptr<IpcReturnedBytes> charge);
  // A new export of a physical allocation of `bytes` whose driver fd is `physical` (kind kVmm).
  std::pair<std::shared_ptr<IpcMemory>, proto::IpcHandle> export_physical(
      proto::UniqueFd physical, std::uint64_t bytes, IpcOwner owner,
      std::shared_ptr<IpcReturnedBytes> charge);
  // The exporter lets go (cuMemFree, cuCtxDestroy, its end): no later open finds it. True if
  // nobody has it open, and the exporter frees it now; else the last closer will.
  bool unexport_memory(IpcMemory& memory);

  // The allocation `handle` names (of `kind`: kMemory or kVmm), if `opener` may open it.
  // Counts nothing. A process may import its own kVmm handle, as with the driver.
  tl::expected<std::shared_ptr<IpcMemory>, IpcRefusal> find_memory(
      const proto::IpcHandle& handle, const IpcOwner& opener,
      proto::IpcKind kind = proto::IpcKind::kMemory);
  // One more session holds it open; false if the exporter let go of it meanwhile.
  bool add_opener(IpcMemory& memory);
  // One session less; true if that was the last holder and the caller frees the memory.
  bool drop_opener(IpcMemory& memory);

  // Exports an event; `event` gets its token and handle.
  void export_event(const std::shared_ptr<IpcEvent>& event, IpcOwner owner);
  tl::expected<std::shared_ptr<IpcEvent>, IpcRefusal> find_event(const proto::IpcHandle& handle,
                                                                 const IpcOwner& opener);
  void forget_event(std::uint64_t token);  // from ~IpcEvent

  // Entries of each kind now (tests: back to 0 when every client has gone).
  std::size_t memory_entries();
  std::size_t event_entries();

 private:
  struct Key {
    std::uint64_t secret[2];
    IpcOwner owner;
  };
  proto::IpcHandle make_handle(proto::IpcKind kind, std::uint64_t token, Key& key);
  // The checks every open makes; the token's key if they pass.
  tl::expected<std::uint64_t, IpcRefusal> check(const proto::IpcHandle& handle, proto::IpcKind kind,
                                                const IpcOwner& opener, const Key* key);

  const int device_;
  const std::uint64_t server_id_;
  std::mutex mutex_;
  std::uint64_t next_token_ = 1;
  std::unordered_map<std::uint64_t, std::pair<Key, std::shared_ptr<IpcMemory>>> memory_;
  std::unordered_map<std::uint64_t, std::pair<Key, std::weak_ptr<IpcEvent>>> events_;
};

// 64-bit words from the kernel's random source (getrandom): secrets and server ids.
std::uint64_t random_word();

}  // namespace mpsshim::server

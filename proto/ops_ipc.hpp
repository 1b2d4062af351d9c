// Payloads of the interprocess-handle opcodes (Op 97..101): cuIpcGetMemHandle,
// cuIpcOpenMemHandle, cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle between
// clients of one server (docs/ipc.md).
//
// A CUipcMemHandle / CUipcEventHandle is 64 opaque bytes the application carries from one
// process to another itself (a pipe, a file, torch.multiprocessing). mpsshim fills them with an
// IpcHandle: the server that issued it, the registry entry it names and a 128-bit random
// secret that entry checks, so a client cannot guess another's handle, and a handle of another
// GPU's server or of the real driver is told apart and refused cleanly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

inline constexpr std::uint32_t kIpcHandleMagic = 0x4849534d;  // "MSIH" in memory order
inline constexpr std::uint16_t kIpcHandleVersion = 1;

// kVmm: a VMM physical allocation shared by fd (proto/ops_vmm_share.hpp).
enum class IpcKind : std::uint16_t { kMemory = 1, kEvent = 2, kVmm = 3 };

// Exactly the size of CUipcMemHandle and CUipcEventHandle (CU_IPC_HANDLE_SIZE).
struct IpcHandle {
  std::uint32_t magic;     // kIpcHandleMagic
  std::uint16_t kind;      // IpcKind
  std::uint16_t version;   // kIpcHandleVersion
  std::uint32_t device;    // the issuing server's GPU, as mpsshimd numbers them
  std::uint32_t reserved;  // 0
  // Random per server process: a handle of another GPU's server, or of a server since
  // restarted, does not name this server's entries.
  std::uint64_t server_id;
  std::uint64_t token;      // the entry in that server's registry
  std::uint64_t secret[2];  // 128 random bits drawn for this export, checked by the registry
  // Memory: where the exported pointer lies in its allocation and how large the allocation is.
  // Informative only (an open answers the allocation's base, as the driver does).
  std::uint64_t offset;
  std::uint64_t bytes;
};
static_assert(sizeof(IpcHandle) == 64, "CU_IPC_HANDLE_SIZE");
static_assert(offsetof(IpcHandle, server_id) == 16);
static_assert(offsetof(IpcHandle, secret) == 32);

struct IpcGetMemHandleReq {
  std::uint64_t dptr;  // a pointer into one of the client's own allocations
};
struct IpcOpenReq {
  IpcHandle handle;
  WireHandle ctx;       // event: the context the opened event belongs to (memory: 0)
  std::uint32_t flags;  // memory: CUipcMem_flags
  std::uint32_t reserved;
};
struct IpcOpenMemRep {
  std::uint64_t base;   // the exporter's allocation, the same address in every client
  std::uint64_t bytes;  // its size
};

struct IpcCloseRep {
  std::uint32_t still_open;  // opens of this pointer the client has not closed yet
  std::uint32_t reserved;
};

#define MPSSHIM_WIRE_CHECK(T)                                    \
  static_assert(kWireSafe<T>, #T " must be trivially copyable"); \
  static_assert(sizeof(T) % 8 == 0, #T " must pad to 8 bytes");
MPSSHIM_WIRE_CHECK(IpcHandle)
MPSSHIM_WIRE_CHECK(IpcGetMemHandleReq)
MPSSHIM_WIRE_CHECK(IpcOpenReq)
MPSSHIM_WIRE_CHECK(IpcOpenMemRep)
MPSSHIM_WIRE_CHECK(IpcCloseRep)
#undef MPSSHIM_WIRE_CHECK
static_assert(sizeof(IpcOpenReq) == 80);
static_assert(sizeof(IpcHandle) <= kSlotPayloadBytes);

}  // namespace mpsshim::proto

// Payloads of the VMM sharing opcodes (Op 112..114): cuMemExportToShareableHandle and
// cuMemImportFromShareableHandle between clients (docs/vmm.md, "Export and import").
//
// The fd an application gets from an export is a sealed memfd holding one proto::IpcHandle of
// kind IpcKind::kVmm: the exporting server, a registry entry and its 128-bit secret, as for
// cuIpcGetMemHandle. An importer's shim reads it and asks that server to open the entry
// (kVmmOpen): the server checks the importer's user against the exporter's, counts the open
// (the memory stays charged to the exporter while it is held) and sends the driver's own fd,
// which the importer's shim hands to the server of its GPU as before (kVmmImport).
#pragma once

#include <cstdint>

#include "proto/ops.hpp"
#include "proto/ops_ipc.hpp"

namespace mpsshim::proto {

// The name of the memfd an export hands out ("/memfd:mpsshim-vmm-handle" in /proc/PID/fd).
inline constexpr const char* kVmmHandleMemfdName = "mpsshim-vmm-handle";

struct VmmOpenReq {
  IpcHandle handle;  // read from the memfd, kind IpcKind::kVmm
};
struct VmmOpenRep {
  WireHandle open;      // the open's id in this session: kVmmClose takes it
  std::uint64_t bytes;  // the physical allocation's size
};

static_assert(kWireSafe<VmmOpenReq> && sizeof(VmmOpenReq) == 64);
static_assert(kWireSafe<VmmOpenRep> && sizeof(VmmOpenRep) == 16);

}  // namespace mpsshim::proto

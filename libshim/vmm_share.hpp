// VMM physical allocations shared between processes by fd (docs/vmm.md, "Export and import").
// What an export hands the application is a sealed memfd with the exporting server's handle;
// an import opens it on that server (which checks the policy and keeps the memory charged to
// the exporter while the open lasts) and imports the driver's fd it sends into the server of
// the importer's GPU. The open lasts as long as the imported allocation does here: until the
// application released every handle of it and unmapped every mapping of it.
//
// Thread safety: every function may be called from any thread; one mutex over the opens.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "proto/ops_ipc.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::shim {

// The handle in `fd` when it is an export's memfd (the application may pass one of the driver's
// own fds too: false then, and nothing is read from it).
bool read_shared_handle(int fd, proto::IpcHandle* out) noexcept;

// Opens `handle` on the server that issued it (a GPU this process may not see): the driver's fd
// of the allocation into `fd`, that GPU (as mpsshimd numbers it) and the open's id. The
// server's refusal as the driver would answer it.
CUresult open_shared(const proto::IpcHandle& handle, int* issuer, std::uint64_t* open,
                     proto::UniqueFd& fd) noexcept;
// Ends an open on GPU `issuer`'s server (as mpsshimd numbers it).
void close_shared(int issuer, std::uint64_t open) noexcept;

// The life of an imported allocation, by the handle the application holds: made by an import
// of a shared handle, retained, released, mapped and unmapped. The open ends when it was
// released as often as made and retained, and nothing maps it.
void shared_imported(CUmemGenericAllocationHandle handle, int issuer, std::uint64_t open) noexcept;
void shared_retained(CUmemGenericAllocationHandle handle) noexcept;
void shared_released(CUmemGenericAllocationHandle handle) noexcept;
void shared_mapped(CUmemGenericAllocationHandle handle) noexcept;
void shared_unmapped(CUmemGenericAllocationHandle handle) noexcept;

}  // namespace mpsshim::shim

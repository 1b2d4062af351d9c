// VMM physical allocations shared between clients by fd (docs/vmm.md, "Export and import";
// NCCL's P2P transport shares its buffers so), under the same policy as cuIpc handles
// (docs/ipc.md): only a client of the exporter's user opens it, and the memory stays charged
// to the exporter while anyone holds it open.
//
// kVmmShare registers the allocation in the server's IPC registry (kind kVmm, with the driver's
// fd of it) and hands the client a sealed memfd holding the 64-byte handle: that is what the
// application passes to another process. kVmmOpen, on the server that issued the handle, checks
// the opener, counts the open and sends it a duplicate of the driver's fd, which its shim
// imports into the server of its own GPU (kVmmImport). kVmmClose ends the open.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/client_socket.hpp"
#include "broker/server/session/ipc_memory.hpp"
#include "broker/server/session/limit_check.hpp"
#include "common/log.hpp"
#include "proto/ops_vmm_share.hpp"

namespace mpsshim::server {
namespace {

IpcOwner owner_of(const Session& session) {
  return {session.client.uid, session.client.id};
}

// The handle in a sealed memfd: nothing can change or grow it once the client has it.
tl::expected<proto::UniqueFd, CUresult> handle_memfd(const proto::IpcHandle& handle) {
  proto::UniqueFd fd(::memfd_create(proto::kVmmHandleMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return tl::unexpected(CUDA_ERROR_OPERATING_SYSTEM);
  if (::pwrite(fd.get(), &handle, sizeof handle, 0) != static_cast<ssize_t>(sizeof handle) ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) !=
          0) {
    return tl::unexpected(CUDA_ERROR_OPERATING_SYSTEM);
  }
  return fd;
}

}  // namespace

OpResult op_vmm_share(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  PhysicalAllocObj* allocation = exportable_allocation(session, req.handle);
  if (allocation == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (allocation->bytes == PhysicalAllocObj::kImportedBytes) {
    // Another client's memory: its exporter shares it, under its own charge.
    log_warn(
        "{}: cuMemExportToShareableHandle of an imported allocation is not supported by "
        "mpsshim (its exporter shares it); refused",
        session.who());
    return call.done(CUDA_ERROR_NOT_SUPPORTED);
  }
  if (!allocation->shared) {
    int exported = -1;
    if (CUresult r = call.cu.cuMemExportToShareableHandle(
            &exported, allocation->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
    auto [memory, handle] = session.ipc().export_physical(
        proto::UniqueFd(exported), allocation->bytes, owner_of(session), session.charge.returned());
    allocation->shared = std::move(memory);
    allocation->shared_handle = handle;
    log_debug("{} shared a physical allocation of {}", session.who(),
              format_bytes(allocation->bytes));
  }
  auto memfd = handle_memfd(allocation->shared_handle);
  if (!memfd) return call.done(memfd.error());
  if (CUresult r = send_memory_fd(session, std::move(*memfd), allocation->bytes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.done();
}

OpResult op_vmm_open(Call& call) {
  auto req = call.request<proto::VmmOpenReq>();
  Session& session = call.session;
  auto found = session.ipc().find_memory(req.handle, owner_of(session), proto::IpcKind::kVmm);
  if (!found) return call.done(log_ipc_refusal(session, found.error(), "import"));
  std::shared_ptr<IpcMemory> memory = std::move(*found);
  if (!within_client_limit(session, ClientLimit::kIpcOpens)) {
    return call.done(CUDA_ERROR_TOO_MANY_PEERS);
  }
  proto::UniqueFd duplicate(::fcntl(memory->physical.get(), F_DUPFD_CLOEXEC, 0));
  if (!duplicate) return call.done(CUDA_ERROR_OPERATING_SYSTEM);
  if (!session.ipc().add_opener(*memory)) {  // the exporter let go of it since the lookup
    return call.done(CUDA_ERROR_INVALID_HANDLE);
  }
  const std::uint64_t id = ++session.vmm.last_shared_open;
  session.vmm.shared_opens.emplace(id, memory);
  if (CUresult r = send_memory_fd(session, std::move(duplicate), memory->bytes);
      r != CUDA_SUCCESS) {
    session.vmm.shared_opens.erase(id);
    close_shared_open(session, memory);
    return call.done(r);
  }
  log_debug("{} opened a shared physical allocation ({}) of client {}", session.who(),
            format_bytes(memory->bytes), memory->owner.client);
  return call.reply(proto::VmmOpenRep{id, memory->bytes});
}

OpResult op_vmm_close(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  auto it = session.vmm.shared_opens.find(req.handle);
  if (it == session.vmm.shared_opens.end()) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::shared_ptr<IpcMemory> memory = std::move(it->second);
  session.vmm.shared_opens.erase(it);
  close_shared_open(session, memory);
  return call.done();
}

void close_shared_open(Session& session, const std::shared_ptr<IpcMemory>& memory) {
  if (!session.ipc().drop_opener(*memory)) return;
  // The exporter let go of it before: the last open gives the exporter its bytes back (its
  // worker takes them at its next charge). The importers' own handles hold the memory itself.
  memory->charge->bytes.fetch_add(memory->bytes, std::memory_order_acq_rel);
  log_info(
      "{} closed the last open of a shared physical allocation ({}) its exporter had "
      "released; no longer charged to it",
      session.who(), format_bytes(memory->bytes));
}

bool unshare_physical(Session& session, const std::shared_ptr<IpcMemory>& memory) {
  if (session.ipc().unexport_memory(*memory)) return false;
  log_info(
      "{} released a physical allocation ({}) that other clients have open: it stays "
      "charged to it until the last of them closes it",
      session.who(), format_bytes(memory->bytes));
  return true;
}

}  // namespace mpsshim::server

// Memory-pool IPC (docs/memory-pools.md): a pool created with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR is exported as a file descriptor and its allocations as
// CUmemPoolPtrExportData; another process imports the pool from the fd and then each allocation
// from its export data.
//
// Every client of a server shares the server's address space, so nothing is mapped: the export
// data of an allocation is the same proto::IpcHandle cuIpcGetMemHandle gives (the server's
// registry, policy and lifetimes: docs/ipc.md), with its `offset` field (always 0: a pool
// allocation is exported from its base) carrying the exporting pool's random id. The pool's fd
// is a sealed memfd holding that id and the GPU, so that cuMemPoolImportPointer can tell export
// data of another pool, as the driver does.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/ipc.hpp"
#include "libshim/object_pool.hpp"
#include "proto/fd_io.hpp"
#include "proto/ops_ipc.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

static_assert(sizeof(CUmemPoolPtrExportData) == sizeof(proto::IpcHandle));

namespace {

// What the exported fd holds.
struct PoolExportRecord {
  std::uint32_t magic;    // kPoolExportMagic
  std::uint16_t version;  // 1
  std::uint16_t reserved;
  std::uint32_t device;  // the pool's GPU, as mpsshimd numbers them (DeviceSnapshot::ordinal)
  std::uint32_t reserved2;
  std::uint64_t export_id;  // MemPool::export_id
};
constexpr std::uint32_t kPoolExportMagic = 0x4c50534d;  // "MSPL" in memory order

}  // namespace

void mpsshim::shim::make_exportable(MemPool& pool) {
  std::uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof id, 0) != static_cast<ssize_t>(sizeof id)) id = 0;
  }
  pool.export_id = id;
  pool.exportable = true;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolExportToShareableHandle(void* handle_out,
                                                                 CUmemoryPool hpool,
                                                                 CUmemAllocationHandleType type,
                                                                 unsigned long long flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  // The driver answers INVALID_VALUE for a pool not made exportable as `type` (the default pool
  // included) and for other handle types.
  if (pool == nullptr || handle_out == nullptr || flags != 0 || !pool->exportable ||
      type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const proto::DeviceSnapshot* snapshot = device_snapshot(pool->device);
  if (snapshot == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const PoolExportRecord record{
      kPoolExportMagic, 1, 0, static_cast<std::uint32_t>(snapshot->ordinal), 0, pool->export_id};
  // Not close-on-exec, as the driver's: a child the program execs may import it.
  const int fd = ::memfd_create("mpsshim-mempool", MFD_ALLOW_SEALING);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!proto::write_all(fd, &record, sizeof record) ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // The caller owns the fd and sends it to the importer (SCM_RIGHTS, pidfd_getfd), as natively.
  *static_cast<int*>(handle_out) = fd;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool* out, void* handle,
                                                                   CUmemAllocationHandleType type,
                                                                   unsigned long long flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(handle));
  PoolExportRecord record{};
  if (fd < 0 || !proto::pread_all(fd, &record, sizeof record) || record.magic != kPoolExportMagic ||
      record.version != 1) {
    log_once("cuMemPoolImportFromShareableHandle.foreign", LogLevel::kWarn,
             "cuMemPoolImportFromShareableHandle: fd {} is no memory pool exported under mpsshim "
             "(a real driver's pool cannot be imported by a client of the server)",
             fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  int device = -1;
  for (int d = 0; d < visible_device_count(); ++d) {
    const proto::DeviceSnapshot* snapshot = device_snapshot(d);
    if (snapshot != nullptr && snapshot->ordinal == static_cast<int>(record.device)) device = d;
  }
  if (device < 0) {
    log_once("cuMemPoolImportFromShareableHandle.device", LogLevel::kWarn,
             "cuMemPoolImportFromShareableHandle: the pool belongs to a GPU this process does "
             "not see (CUDA_VISIBLE_DEVICES)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  MemPool* pool = ObjectPool<MemPool>::instance().make(Magic::kMemPool, nullptr, device,
                                                       proto::WireHandle{0}, false);
  pool->imported = true;
  pool->export_id = record.export_id;
  *out = reinterpret_cast<CUmemoryPool>(pool);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData* out,
                                                       CUdeviceptr ptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DeviceRange range{};
  // The base of an allocation of an exportable pool of this process's, as the driver requires.
  if (!address_book().find_device(ptr, &range) || range.base != ptr || range.pool_import) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const MemPool* pool = object_of<MemPool>(range.pool);
  if (pool == nullptr || !pool->exportable) return CUDA_ERROR_INVALID_VALUE;
  proto::IpcHandle handle{};
  if (CUresult rc = range.ctx->session->call(proto::Op::kIpcGetMemHandle,
                                             proto::IpcGetMemHandleReq{ptr}, &handle);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  handle.offset = pool->export_id;
  std::memcpy(out->reserved, &handle, sizeof handle);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr* out, CUmemoryPool hpool,
                                                       CUmemPoolPtrExportData* data) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  MemPool* pool = object_of<MemPool>(hpool);
  if (out == nullptr || data == nullptr || pool == nullptr || !pool->imported) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::IpcHandle wire{};
  std::memcpy(&wire, data->reserved, sizeof wire);
  // Export data of another pool (or no mpsshim export data at all): refused as natively.
  if (wire.magic != proto::kIpcHandleMagic ||
      wire.kind != static_cast<std::uint16_t>(proto::IpcKind::kMemory) ||
      wire.offset != pool->export_id) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The import belongs to the pool's device, whatever context is current (the CUDA runtime
  // imports with none current in a process that made no other call yet).
  Context* ctx = nullptr;
  if (current(ctx) != CUDA_SUCCESS || ctx->device != pool->device) {
    if (CUresult rc = primary_context(pool->device, ctx); rc != CUDA_SUCCESS) return rc;
  }
  return ipc_open_memory(ctx, out, wire, 0, hpool);
}

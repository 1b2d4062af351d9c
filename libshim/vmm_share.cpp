#include "libshim/vmm_share.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>

#include "common/log.hpp"
#include "libshim/client.hpp"
#include "proto/ops_vmm_share.hpp"

namespace mpsshim::shim {
namespace {

struct Open {
  int issuer = 0;
  std::uint64_t id = 0;
  std::uint32_t handles = 1;  // the import's, and each retain's
  std::uint32_t mappings = 0;
};

struct Opens {
  std::mutex mutex;
  std::unordered_map<CUmemGenericAllocationHandle, Open> by_handle;
};

Opens& opens() {
  static Opens* o = new Opens();  // never destroyed: used from atexit paths
  return *o;
}

// The open of `handle` changed; it ends (its server told, outside the lock) if nothing holds
// the allocation any more.
template <typename Change>
void update(CUmemGenericAllocationHandle handle, Change change) noexcept {
  Open ended{};
  {
    std::lock_guard lock(opens().mutex);
    auto it = opens().by_handle.find(handle);
    if (it == opens().by_handle.end()) return;
    change(it->second);
    if (it->second.handles != 0 || it->second.mappings != 0) return;
    ended = it->second;
    opens().by_handle.erase(it);
  }
  close_shared(ended.issuer, ended.id);
}

}  // namespace

bool read_shared_handle(int fd, proto::IpcHandle* out) noexcept {
  // A sealed regular file of exactly one handle: a memfd of an export. The driver's fds are
  // device files, never read here.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size != static_cast<off_t>(sizeof(proto::IpcHandle))) {
    return false;
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_WRITE) == 0) return false;
  proto::IpcHandle handle{};
  if (::pread(fd, &handle, sizeof handle, 0) != static_cast<ssize_t>(sizeof handle)) return false;
  if (handle.magic != proto::kIpcHandleMagic ||
      handle.kind != static_cast<std::uint16_t>(proto::IpcKind::kVmm)) {
    return false;
  }
  *out = handle;
  return true;
}

CUresult open_shared(const proto::IpcHandle& handle, int* issuer, std::uint64_t* open,
                     proto::UniqueFd& fd) noexcept {
  const int gpu = static_cast<int>(handle.device);
  Session* session = nullptr;
  if (CUresult rc = session_for_gpu(gpu, session); rc != CUDA_SUCCESS) return rc;
  proto::VmmOpenRep reply{};
  {
    std::lock_guard receiving(session->fd_receive_mutex());
    if (CUresult rc = session->call(proto::Op::kVmmOpen, proto::VmmOpenReq{handle}, &reply);
        rc != CUDA_SUCCESS) {
      log_once("vmm.shared_refused", LogLevel::kWarn,
               "cuMemImportFromShareableHandle: refused by GPU {}'s server ({}); its log says "
               "why (another user's handle, one whose exporter released it, a forged one)",
               gpu, static_cast<int>(rc));
      return rc;
    }
    if (CUresult rc = session->receive_fd(proto::MessageKind::kPeerMemory, fd);
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  *issuer = gpu;
  *open = reply.open;
  return CUDA_SUCCESS;
}

void close_shared(int issuer, std::uint64_t open) noexcept {
  Session* session = nullptr;
  if (session_for_gpu(issuer, session) != CUDA_SUCCESS) return;
  if (CUresult rc =
          session->call(proto::Op::kVmmClose, proto::HandleReq{open}, static_cast<int*>(nullptr));
      rc != CUDA_SUCCESS) {
    log_warn("GPU {}'s server did not end an open of shared VMM memory ({})", issuer,
             static_cast<int>(rc));
  }
}

void shared_imported(CUmemGenericAllocationHandle handle, int issuer, std::uint64_t open) noexcept {
  bool fresh = false;
  try {
    std::lock_guard lock(opens().mutex);
    auto [it, inserted] = opens().by_handle.try_emplace(handle, Open{issuer, open});
    fresh = inserted;
    // Otherwise the server answered a handle it gave before: one more of the first open's.
    if (!inserted) ++it->second.handles;
  } catch (...) {
  }
  if (!fresh) close_shared(issuer, open);
}

void shared_retained(CUmemGenericAllocationHandle handle) noexcept {
  update(handle, [](Open& o) { ++o.handles; });
}

void shared_released(CUmemGenericAllocationHandle handle) noexcept {
  update(handle, [](Open& o) {
    if (o.handles != 0) --o.handles;
  });
}

void shared_mapped(CUmemGenericAllocationHandle handle) noexcept {
  update(handle, [](Open& o) { ++o.mappings; });
}

void shared_unmapped(CUmemGenericAllocationHandle handle) noexcept {
  update(handle, [](Open& o) {
    if (o.mappings != 0) --o.mappings;
  });
}

}  // namespace mpsshim::shim

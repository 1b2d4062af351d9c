#include "libshim/peer.hpp"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "common/log.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "proto/address_arenas.hpp"
#include "proto/ops.hpp"

namespace mpsshim::shim {
namespace {

constexpr int kMaxPeerDevices = static_cast<int>(proto::kMaxArenas);

// "CUDA_ERROR_INVALID_VALUE", for the log.
const char* error_name(CUresult rc) {
  const char* name = nullptr;
  return cuGetErrorName(rc, &name) == CUDA_SUCCESS && name != nullptr ? name : "an unknown error";
}

struct MappedBlock {
  std::uint64_t bytes = 0;
  int owner = -1;
};

struct Peers {
  std::mutex mutex;
  // Per device: the blocks of other devices its server has mapped, by base.
  std::array<std::map<CUdeviceptr, MappedBlock>, kMaxPeerDevices> mapped;
  // enabled[h][g]: device h's contexts reach all of device g's memory (cuCtxEnablePeerAccess).
  std::array<std::array<bool, kMaxPeerDevices>, kMaxPeerDevices> enabled{};
  // Whether any was ever enabled: cuMemAlloc looks at it alone until then (no lock).
  std::atomic<bool> any_enabled{false};
};

Peers& peers() {
  static Peers* p = new Peers();  // never destroyed: used from atexit paths
  return *p;
}

// Under peers().mutex: the first address of [address, address + bytes) that `device`'s server
// does not map yet; address + bytes when it maps all of it. An allocation the server made of
// several physical allocations (memory handed over by preempted clients) is mapped one of them
// at a time, each its own block, the blocks adjacent.
CUdeviceptr first_unmapped_locked(int device, CUdeviceptr address, std::size_t bytes) {
  const auto& blocks = peers().mapped[static_cast<std::size_t>(device)];
  const CUdeviceptr end = address + bytes;
  CUdeviceptr at = address;
  while (at < end) {
    auto after = blocks.upper_bound(at);
    if (after == blocks.begin()) return at;
    auto it = std::prev(after);
    if (at - it->first >= it->second.bytes) return at;
    at = it->first + it->second.bytes;
  }
  return end;
}

bool mapped_locked(int device, CUdeviceptr address, std::size_t bytes) {
  return first_unmapped_locked(device, address, bytes) == address + bytes;
}

// Under peers().mutex: g's block holding `address`, mapped into h's server.
CUresult map_block_locked(int h, int g, CUdeviceptr address) {
  Session* from = nullptr;
  Session* to = nullptr;
  if (CUresult rc = session_for(g, from); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = session_for(h, to); rc != CUDA_SUCCESS) return rc;
  proto::PeerExportRep block{};
  proto::UniqueFd fd;
  {
    std::lock_guard receiving(from->fd_receive_mutex());
    proto::PeerExportReq request{address};
    if (CUresult rc = from->call(proto::Op::kPeerExport, request, &block); rc != CUDA_SUCCESS) {
      return rc;
    }
    if (CUresult rc = from->receive_fd(proto::MessageKind::kPeerMemory, fd); rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  std::uint32_t token = 0;
  if (CUresult rc = to->send_fd(proto::MessageKind::kPeerMemory, fd.get(), block.bytes, token);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  proto::PeerImportReq request{block.base, block.bytes, token, 0};
  if (CUresult rc = to->call(proto::Op::kPeerImport, request, static_cast<int*>(nullptr));
      rc != CUDA_SUCCESS) {
    log_warn("mapping device {}'s memory at {:#x} into device {}'s server failed ({})", g,
             block.base, h, error_name(rc));
    return rc;
  }
  peers().mapped[static_cast<std::size_t>(h)][block.base] = MappedBlock{block.bytes, g};
  log_debug("device {}'s block {:#x} (+{} bytes) mapped into device {}'s server", g, block.base,
            block.bytes, h);
  return CUDA_SUCCESS;
}

bool valid(int device) {
  return device >= 0 && device < visible_device_count() && device < kMaxPeerDevices;
}

}  // namespace

CUresult map_vmm_on_peer(int peer, int owner, CUdeviceptr base, std::size_t bytes,
                         std::uint64_t handle) noexcept {
  if (!valid(peer) || !valid(owner) || peer == owner) return CUDA_ERROR_INVALID_DEVICE;
  try {
    std::lock_guard lock(peers().mutex);
    if (mapped_locked(peer, base, bytes)) return CUDA_SUCCESS;
    Session* from = nullptr;
    Session* to = nullptr;
    if (CUresult rc = session_for(owner, from); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = session_for(peer, to); rc != CUDA_SUCCESS) return rc;
    proto::UniqueFd fd;
    {
      std::lock_guard receiving(from->fd_receive_mutex());
      if (CUresult rc = from->call(proto::Op::kVmmExport, proto::HandleReq{handle},
                                   static_cast<int*>(nullptr));
          rc != CUDA_SUCCESS) {
        log_warn(
            "giving device {} access to device {}'s VMM memory at {:#x} needs it created "
            "exportable (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ({})",
            peer, owner, base, error_name(rc));
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      if (CUresult rc = from->receive_fd(proto::MessageKind::kPeerMemory, fd); rc != CUDA_SUCCESS) {
        return rc;
      }
    }
    std::uint32_t token = 0;
    if (CUresult rc = to->send_fd(proto::MessageKind::kPeerMemory, fd.get(), bytes, token);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    proto::PeerImportReq request{base, bytes, token, 0};
    if (CUresult rc = to->call(proto::Op::kPeerImport, request, static_cast<int*>(nullptr));
        rc != CUDA_SUCCESS) {
      return rc;
    }
    peers().mapped[static_cast<std::size_t>(peer)][base] = MappedBlock{bytes, owner};
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

bool peer_maps(int device, CUdeviceptr address) noexcept {
  if (!valid(device)) return false;
  std::lock_guard lock(peers().mutex);
  return mapped_locked(device, address, 1);
}

int device_of_address(CUdeviceptr address) noexcept {
  const int physical = proto::arena_holding(address);
  if (physical < 0) return -1;
  for (int d = 0; d < visible_device_count(); ++d) {
    const proto::DeviceSnapshot* snapshot = device_snapshot(d);
    if (snapshot != nullptr && snapshot->ordinal == physical && snapshot->arena_bytes != 0) {
      return d;
    }
  }
  return -1;
}

CUresult reach_from(int device, CUdeviceptr address, std::size_t bytes) noexcept {
  // The common case first, with no lock: host memory, or this device's own.
  const int physical = proto::arena_holding(address);
  if (physical < 0) return CUDA_SUCCESS;
  if (const proto::DeviceSnapshot* own = device_snapshot(device);
      own != nullptr && own->ordinal == physical) {
    return CUDA_SUCCESS;
  }
  const int owner = device_of_address(address);
  if (owner < 0 || owner == device) return CUDA_SUCCESS;
  if (!valid(device)) return CUDA_ERROR_INVALID_DEVICE;
  try {
    std::lock_guard lock(peers().mutex);
    const std::size_t length = std::max<std::size_t>(bytes, 1);
    // Each block the range reaches, until it is all mapped. A range that runs past the client's
    // allocation fails on the server's side: the driver refuses it too.
    for (CUdeviceptr at = first_unmapped_locked(device, address, length); at != address + length;
         at = first_unmapped_locked(device, address, length)) {
      if (CUresult rc = map_block_locked(device, owner, at); rc != CUDA_SUCCESS) return rc;
      if (first_unmapped_locked(device, address, length) == at) return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

void forget_peer_blocks(int owner, CUdeviceptr base, std::size_t bytes) noexcept {
  if (!valid(owner)) return;
  try {
    std::lock_guard lock(peers().mutex);
    for (int h = 0; h < visible_device_count() && h < kMaxPeerDevices; ++h) {
      auto& blocks = peers().mapped[static_cast<std::size_t>(h)];
      if (blocks.empty()) continue;
      std::vector<CUdeviceptr> gone;
      auto it = blocks.upper_bound(base);
      if (it != blocks.begin()) --it;
      for (; it != blocks.end() && it->first < base + std::max<std::size_t>(bytes, 1); ++it) {
        // A chunk of small allocations goes only with the last of them the process holds:
        // the others may still be used from this device.
        if (it->second.owner == owner && it->first + it->second.bytes > base &&
            !address_book().others_within(it->first, it->first + it->second.bytes, base)) {
          gone.push_back(it->first);
        }
      }
      Session* session = nullptr;
      if (gone.empty() || session_for(h, session) != CUDA_SUCCESS) continue;
      for (CUdeviceptr block : gone) {
        proto::PeerReleaseReq request{block};
        if (CUresult rc =
                session->call(proto::Op::kPeerRelease, request, static_cast<int*>(nullptr));
            rc != CUDA_SUCCESS) {
          log_warn("device {}'s server did not let go of device {}'s block {:#x} ({})", h, owner,
                   block, error_name(rc));
        }
        blocks.erase(block);
      }
    }
  } catch (...) {
  }
}

CUresult enable_peer_access(int device, int peer) noexcept {
  if (!valid(device) || !valid(peer) || device == peer) return CUDA_ERROR_INVALID_DEVICE;
  std::vector<DeviceRange> held;
  try {
    {
      std::lock_guard lock(peers().mutex);
      bool& on = peers().enabled[static_cast<std::size_t>(device)][static_cast<std::size_t>(peer)];
      if (on) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
      on = true;
      peers().any_enabled.store(true, std::memory_order_release);
    }
    held = address_book().device_ranges();
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (const DeviceRange& range : held) {
    if (range.vmm || range.ipc_opened || range.module_global || range.ctx == nullptr ||
        range.ctx->device != peer) {
      continue;
    }
    if (CUresult rc = reach_from(device, range.base, range.bytes); rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

CUresult disable_peer_access(int device, int peer) noexcept {
  if (!valid(device) || !valid(peer) || device == peer) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(peers().mutex);
  bool& on = peers().enabled[static_cast<std::size_t>(device)][static_cast<std::size_t>(peer)];
  if (!on) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  // What is mapped stays until it is freed: copies still use it, as they may without peer access.
  on = false;
  return CUDA_SUCCESS;
}

CUresult share_with_peers(int owner, CUdeviceptr base, std::size_t bytes) noexcept {
  if (!peers().any_enabled.load(std::memory_order_acquire) || !valid(owner)) return CUDA_SUCCESS;
  for (int h = 0; h < visible_device_count() && h < kMaxPeerDevices; ++h) {
    bool on = false;
    {
      std::lock_guard lock(peers().mutex);
      on = peers().enabled[static_cast<std::size_t>(h)][static_cast<std::size_t>(owner)];
    }
    if (!on) continue;
    if (CUresult rc = reach_from(h, base, bytes); rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim

#include "broker/server/session/vmm_park.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "broker/server/session/session.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// The client's own physical allocations: imported ones are another process's memory.
std::vector<std::uint64_t> own_allocations(const Session& s) {
  return s.objects.ids_where<PhysicalAllocObj>(
      [](const PhysicalAllocObj& a) { return a.bytes != PhysicalAllocObj::kImportedBytes; });
}

CUmemAccessDesc device_access(const Session& s, std::uint32_t flags) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = s.gpu().device;
  access.flags = static_cast<CUmemAccess_flags>(flags);
  return access;
}

// Whether memory preemption's handover may take the allocation (device_heap.hpp): exportable as
// a POSIX fd, as the heap's own memory, and plain.
bool fit_for_handover(const PhysicalAllocObj& a) {
  return (a.prop.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0 &&
         a.prop.compression == CU_MEM_ALLOCATION_COMP_NONE;
}

// The whole of a physical allocation mapped read-write at a free range of the server's arena,
// for the copies out and in (the client's own mappings may cover only part of it, or none).
// Unmapped at the end of scope: the caller waits for the copies first. With `for_handover`, in
// the addresses a handover prepared when they have room (DeviceHeap::place_handover_view), where
// it may stay mapped (hand_over).
class WholeView {
 public:
  WholeView(Session& s, const PhysicalAllocObj& a, bool for_handover = false)
      : s_(s), bytes_(a.bytes) {
    DeviceHeap& heap = *s.gpu().heap;
    // Mapped at the allocation's own granularity, which its properties may make coarser.
    std::size_t granularity = heap.granularity();
    CUmemAllocationProp prop;
    if (driver_prop(s, a.prop, &prop) == CUDA_SUCCESS) {
      std::size_t own = 0;
      if (s.cu().cuMemGetAllocationGranularity(&own, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
          CUDA_SUCCESS) {
        granularity = std::max(granularity, own);
      }
    }
    const std::uint64_t bytes = a.bytes;
    const CUmemGenericAllocationHandle handle = a.handle;
    std::optional<CUdeviceptr> at;
    if (for_handover) at = heap.place_handover_view(s.client.id, bytes, granularity);
    placed_ = at.has_value();
    if (!at) at = heap.arena().take(bytes, granularity);
    if (!at) {
      result_ = CUDA_ERROR_OUT_OF_MEMORY;
      return;
    }
    address_ = *at;
    if (result_ = s.cu().cuMemMap(address_, bytes, 0, handle, 0); result_ != CUDA_SUCCESS) return;
    mapped_ = true;
    const CUmemAccessDesc access = device_access(s, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    result_ = s.cu().cuMemSetAccess(address_, bytes, &access, 1);
  }
  ~WholeView() {
    if (mapped_) s_.cu().cuMemUnmap(address_, bytes_);
    if (address_ == 0) return;
    if (placed_) {
      s_.gpu().heap->forget_handover_view(address_, bytes_);
    } else {
      s_.gpu().heap->arena().give(address_, bytes_);
    }
  }
  WholeView(const WholeView&) = delete;
  WholeView& operator=(const WholeView&) = delete;

  CUresult result() const { return result_; }
  CUdeviceptr address() const { return address_; }
  // A view made in a handover's addresses, left mapped for it: its address, which the caller now
  // unmaps or hands over (ParkedVmm::handover_views). 0 for any other view.
  CUdeviceptr hand_over() {
    if (!placed_ || !mapped_ || result_ != CUDA_SUCCESS) return 0;
    mapped_ = false;
    const CUdeviceptr at = address_;
    address_ = 0;
    return at;
  }

 private:
  Session& s_;
  const std::uint64_t bytes_;
  CUdeviceptr address_ = 0;
  bool placed_ = false;
  bool mapped_ = false;
  CUresult result_ = CUDA_SUCCESS;
};

// A parked allocation during a copy: its id, its place in the host block, its whole view once made.
struct Segment {
  std::uint64_t id = 0;
  std::uint64_t at = 0;
  std::uint64_t bytes = 0;
  std::unique_ptr<WholeView> view;
};

// Views of the allocations `ids` (their handles live) at their places in the host block
// (PhysicalAllocObj::parked_at). Each view is made when a copy first reaches its allocation, so
// that the driver's mapping and access of the next ones (25-42 us each, a tenth of copying a
// 20 MiB allocation at 55 GB/s; thousands for PyTorch's expandable segments) run while the copies
// queued before them move bytes. The views stay mapped while this lives; the caller waits for the
// copies first.
class ViewSet {
 public:
  // `for_handover`: the copy is a suspend's, whose memory a handover may take.
  ViewSet(Session& s, const std::vector<std::uint64_t>& ids, bool for_handover)
      : s_(s), for_handover_(for_handover) {
    for (std::uint64_t id : ids) {
      const PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
      segments_.push_back(Segment{id, a.parked_at, a.bytes, nullptr});
    }
    std::sort(segments_.begin(), segments_.end(),
              [](const Segment& x, const Segment& y) { return x.at < y.at; });
  }

  // Queues the copies between the block's piece [offset, offset + bytes), at `piece`, and the
  // views it overlaps, making those views first.
  CUresult copy(void* piece, std::uint64_t offset, std::uint64_t bytes, bool to_host,
                CUstream stream) {
    auto it = std::upper_bound(segments_.begin(), segments_.end(), offset,
                               [](std::uint64_t o, const Segment& seg) { return o < seg.at; });
    if (it != segments_.begin()) --it;
    const std::uint64_t end = offset + bytes;
    for (; it != segments_.end() && it->at < end; ++it) {
      const std::uint64_t lo = std::max(offset, it->at), hi = std::min(end, it->at + it->bytes);
      if (lo >= hi) continue;
      if (it->view == nullptr) {
        const PhysicalAllocObj& a = *s_.objects.get<PhysicalAllocObj>(it->id);
        it->view = std::make_unique<WholeView>(s_, a, for_handover_ && fit_for_handover(a));
        if (CUresult r = it->view->result(); r != CUDA_SUCCESS) return r;
      }
      void* host = static_cast<std::byte*>(piece) + (lo - offset);
      const CUdeviceptr device = it->view->address() + (lo - it->at);
      const CUresult r = to_host ? s_.cu().cuMemcpyDtoHAsync_v2(host, device, hi - lo, stream)
                                 : s_.cu().cuMemcpyHtoDAsync_v2(device, host, hi - lo, stream);
      if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  }

  // The views made in a handover's addresses, left mapped for it (WholeView::hand_over): by
  // allocation id.
  std::map<std::uint64_t, CUdeviceptr> hand_over() {
    std::map<std::uint64_t, CUdeviceptr> out;
    for (Segment& seg : segments_) {
      if (seg.view == nullptr) continue;
      if (CUdeviceptr at = seg.view->hand_over(); at != 0) out[seg.id] = at;
    }
    return out;
  }

 private:
  Session& s_;
  const bool for_handover_;
  std::vector<Segment> segments_;  // by place in the block
};

// Maps the client's range `base` onto its allocation's current handle, with its access.
CUresult map_again(Session& s, std::uint64_t base, const VmmMapping& m,
                   CUmemGenericAllocationHandle handle) {
  if (CUresult r = s.cu().cuMemMap(base, m.bytes, m.offset, handle, 0); r != CUDA_SUCCESS) {
    return r;
  }
  if (m.access == CU_MEM_ACCESS_FLAGS_PROT_NONE) return CUDA_SUCCESS;  // never given access
  const CUmemAccessDesc access = device_access(s, m.access);
  if (CUresult r = s.cu().cuMemSetAccess(base, m.bytes, &access, 1); r != CUDA_SUCCESS) {
    s.cu().cuMemUnmap(base, m.bytes);
    return r;
  }
  return CUDA_SUCCESS;
}

// The client's mappings onto `id`, by base.
std::vector<std::uint64_t> mappings_of(const Session& s, std::uint64_t id) {
  std::vector<std::uint64_t> bases;
  for (const auto& [base, m] : s.vmm.mappings) {
    if (m.allocation == id) bases.push_back(base);
  }
  return bases;
}

// Unmaps `mapped` (client ranges) and releases every parked allocation that has device memory
// again: what restore_vmm made, undone. The host copies stay.
void take_off_device(Session& s, const std::vector<std::uint64_t>& mapped) {
  for (std::uint64_t base : mapped) s.cu().cuMemUnmap(base, s.vmm.mappings.at(base).bytes);
  for (std::uint64_t id : own_allocations(s)) {
    PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
    if (!a.parked || a.handle == 0) continue;
    s.cu().cuMemRelease(a.handle);
    a.handle = 0;
  }
}

// The view of allocation `id` a suspend left mapped for a handover (ParkedVmm::handover_views),
// unmapped and its addresses given back: the handover does not take it.
void drop_handover_view(Session& s, std::uint64_t id) {
  auto view = s.vmm.parked.handover_views.find(id);
  if (view == s.vmm.parked.handover_views.end()) return;
  const CUdeviceptr at = view->second;
  s.vmm.parked.handover_views.erase(view);
  const std::uint64_t bytes = s.objects.get<PhysicalAllocObj>(id)->bytes;
  if (CUresult r = s.cu().cuMemUnmap(at, bytes); r != CUDA_SUCCESS) {
    // Still mapped, the addresses cannot be handed out again.
    log_warn("{}: unmapping the view of a physical allocation at {:#x} failed: {}", s.who(), at,
             describe(s.cu(), r));
    return;
  }
  s.gpu().heap->forget_handover_view(at, bytes);
}

}  // namespace

std::string why_vmm_not_parkable(Session& s) {
  std::map<std::uint64_t, std::uint32_t> client_mappings;
  for (const auto& [base, m] : s.vmm.mappings) ++client_mappings[m.allocation];
  for (std::uint64_t id : own_allocations(s)) {
    const PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
    if (a.exported || a.shared) {
      return "it handed a physical allocation of its own (cuMemCreate) to other processes as a "
             "shareable handle, and they may have mapped it";
    }
    // Each sparse array holding it counts one mapping beyond the client's ranges
    // (ops/sparse_array.cpp).
    if (a.mappings > client_mappings[id]) {
      return "tiles of its sparse arrays are mapped onto a physical allocation of its own "
             "(cuMemMapArrayAsync), and the server does not follow tiles to map them again";
    }
  }
  return {};
}

tl::expected<VmmParked, CUresult> copy_out_vmm(Session& s, CUstream stream) {
  const std::vector<std::uint64_t> ids = own_allocations(s);
  std::uint64_t total = 0;
  for (std::uint64_t id : ids) {
    PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
    a.parked_at = total;
    total += a.bytes;
  }
  if (total == 0) return VmmParked{};
  ViewSet views(s, ids, true);
  auto copy = s.gpu().heap->copy_to_host(
      total, stream, [&](void* piece, std::uint64_t offset, std::uint64_t bytes) {
        return views.copy(piece, offset, bytes, true, stream);
      });
  if (!copy) return tl::unexpected(copy.error());
  if (CUresult r = s.cu().cuStreamSynchronize(stream); r != CUDA_SUCCESS) {
    s.gpu().heap->unpin(copy->host, total);
    return tl::unexpected(r);
  }
  s.vmm.parked = ParkedVmm{copy->host, total, views.hand_over()};
  for (std::uint64_t id : ids) s.objects.get<PhysicalAllocObj>(id)->parked = true;
  return VmmParked{total, copy->pooled ? total : 0};
}

std::uint64_t release_copied_vmm(Session& s) {
  std::uint64_t released = 0;
  for (std::uint64_t id : own_allocations(s)) {
    PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
    if (!a.parked) continue;
    const std::vector<std::uint64_t> bases = mappings_of(s, id);
    std::vector<std::uint64_t> unmapped;
    CUresult failed = CUDA_SUCCESS;
    for (std::uint64_t base : bases) {
      if (failed = s.cu().cuMemUnmap(base, s.vmm.mappings.at(base).bytes); failed != CUDA_SUCCESS) {
        break;
      }
      unmapped.push_back(base);
    }
    if (failed != CUDA_SUCCESS) {
      drop_handover_view(s, id);
      // Still mapped, it could not be mapped again at resume: it stays on the device, whole.
      log_warn("{}: unmapping a physical allocation to park failed, so it stays on the device: {}",
               s.who(), describe(s.cu(), failed));
      for (std::uint64_t base : unmapped) {
        if (CUresult r = map_again(s, base, s.vmm.mappings.at(base), a.handle); r != CUDA_SUCCESS) {
          log_error("{}: mapping {:#x} again failed, so its kernels will fault there: {}", s.who(),
                    base, describe(s.cu(), r));
        }
      }
      a.parked = false;  // its bytes in the block go with the block
      continue;
    }
    // Memory preemption's handover takes it when it can (device_heap.hpp): with the view the
    // copy made in its addresses still mapped there, or unmapped.
    DeviceHeap& heap = *s.gpu().heap;
    const bool plain = fit_for_handover(a);
    auto view = s.vmm.parked.handover_views.find(id);
    if (view != s.vmm.parked.handover_views.end() &&
        heap.keep_for_handover(s.client.id, a.handle, a.bytes, view->second)) {
      s.vmm.parked.handover_views.erase(view);  // the heap owns it and its view now
    } else if (drop_handover_view(s, id);
               plain && heap.keep_for_handover(s.client.id, a.handle, a.bytes)) {
      // The heap owns it now.
    } else if (CUresult r = s.cu().cuMemRelease(a.handle); r != CUDA_SUCCESS) {
      log_warn("{}: cuMemRelease of a parked physical allocation failed: {}", s.who(),
               describe(s.cu(), r));
    }
    a.handle = 0;
    released += a.bytes;
  }
  // Views of allocations left on the device: not handed over.
  while (!s.vmm.parked.handover_views.empty()) {
    drop_handover_view(s, s.vmm.parked.handover_views.begin()->first);
  }
  return released;
}

void drop_vmm_copies(Session& s) {
  if (s.vmm.parked.host == nullptr) return;
  while (!s.vmm.parked.handover_views.empty()) {
    drop_handover_view(s, s.vmm.parked.handover_views.begin()->first);
  }
  s.gpu().heap->unpin(s.vmm.parked.host, s.vmm.parked.bytes);
  s.vmm.parked = {};
  for (std::uint64_t id : own_allocations(s)) s.objects.get<PhysicalAllocObj>(id)->parked = false;
}

tl::expected<std::uint64_t, CUresult> restore_vmm(Session& s, CUstream stream) {
  std::vector<std::uint64_t> parked;
  for (std::uint64_t id : own_allocations(s)) {
    const PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
    if (a.parked && a.handle == 0) parked.push_back(id);
  }
  if (parked.empty()) return 0;
  std::vector<std::uint64_t> mapped;
  auto fail = [&](CUresult r) {
    take_off_device(s, mapped);
    return tl::unexpected(r);
  };
  // Every allocation gets its device memory before any byte moves: all or nothing.
  for (std::uint64_t id : parked) {
    PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(id);
    CUmemAllocationProp prop;
    if (CUresult r = driver_prop(s, a.prop, &prop); r != CUDA_SUCCESS) return fail(r);
    CUmemGenericAllocationHandle handle = 0;
    if (CUresult r = s.cu().cuMemCreate(&handle, a.bytes, &prop, 0); r != CUDA_SUCCESS) {
      return fail(r);
    }
    a.handle = handle;
  }
  std::uint64_t back = 0;
  {
    ViewSet views(s, parked, false);
    CUresult failed =
        for_each_parked_piece(s.vmm.parked.host, s.vmm.parked.bytes,
                              [&](void* piece, std::uint64_t offset, std::uint64_t bytes) {
                                return views.copy(piece, offset, bytes, false, stream);
                              });
    // The client's ranges are mapped while the copies run: the driver's mapping and access of
    // each cost a tenth of copying a 20 MiB allocation. Nothing of the client's runs until the
    // resume ends.
    for (std::size_t i = 0; i < parked.size() && failed == CUDA_SUCCESS; ++i) {
      const PhysicalAllocObj& a = *s.objects.get<PhysicalAllocObj>(parked[i]);
      for (std::uint64_t base : mappings_of(s, parked[i])) {
        if (failed = map_again(s, base, s.vmm.mappings.at(base), a.handle);
            failed != CUDA_SUCCESS) {
          break;
        }
        mapped.push_back(base);
      }
      back += a.bytes;
    }
    if (CUresult r = s.cu().cuStreamSynchronize(stream); failed == CUDA_SUCCESS) failed = r;
    if (failed != CUDA_SUCCESS) return fail(failed);
  }
  return back;
}

void unrestore_vmm(Session& s) {
  std::vector<std::uint64_t> mapped;
  for (const auto& [base, m] : s.vmm.mappings) {
    const PhysicalAllocObj* a = s.objects.get<PhysicalAllocObj>(m.allocation);
    if (a != nullptr && a->parked && a->handle != 0) mapped.push_back(base);
  }
  take_off_device(s, mapped);
}

void free_vmm_copies(Session& s, CUcontext context) {
  if (s.vmm.parked.host == nullptr) return;
  s.gpu().heap->release_host(context, s.vmm.parked.host, s.vmm.parked.bytes);
  s.vmm.parked = {};
  for (std::uint64_t id : own_allocations(s)) s.objects.get<PhysicalAllocObj>(id)->parked = false;
}

}  // namespace mpsshim::server

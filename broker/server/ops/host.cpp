#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/client_socket.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

std::uint64_t page_size() {
  return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Maps the client's memfd at the client's own address when that range is free here too, so
// that under UVA the host pointer is also the device pointer in both processes.
void* map_region(int fd, std::uint64_t client_address, std::uint64_t bytes) {
  if (client_address != 0 && client_address % page_size() == 0) {
    void* want = reinterpret_cast<void*>(client_address);
    void* at = ::mmap(want, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (at == want) return at;
    // Kernels before 4.17 treat the flag as a hint and may map elsewhere.
    if (at != MAP_FAILED) ::munmap(at, bytes);
  }
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return at == MAP_FAILED ? nullptr : at;
}

struct HostBytes {
  std::byte* pointer = nullptr;
  bool chunk = false;
};

// Where the host side of a copy is, if the reference lies inside the client's own bytes.
bool resolve_host(Session& session, const proto::HostRef& ref, std::uint64_t bytes,
                  HostBytes& out) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  if (bytes > kMax - ref.offset) return false;
  if (ref.kind == proto::HostKind::kPinnedRegion) {
    const HostRegionObj* region = session.objects.get<HostRegionObj>(ref.handle);
    if (region == nullptr || ref.offset + bytes > region->bytes) return false;
    out.pointer = static_cast<std::byte*>(region->address) + ref.offset;
    out.chunk = false;
    return true;
  }
  if (ref.kind == proto::HostKind::kStagingChunk) {
    const proto::SegmentHeader& g = session.segment.geometry();
    if (ref.handle >= g.chunk_count || ref.offset + bytes > g.chunk_bytes) return false;
    out.pointer = session.segment.view().chunk(static_cast<std::uint32_t>(ref.handle)) + ref.offset;
    out.chunk = true;
    return true;
  }
  return false;
}

OpResult copy_host(Call& call, bool to_device) {
  auto req = call.request<proto::CopyHostReq>();
  Session& session = call.session;
  const bool names_chunk = req.host.kind == proto::HostKind::kStagingChunk &&
                           req.host.handle < session.segment.geometry().chunk_count;
  const auto chunk = static_cast<std::uint32_t>(req.host.handle);
  // A staging chunk is always handed back, even by a copy that fails, or the client would
  // wait on it forever. A one-way copy's error goes to async_error first: a client that wakes
  // on the chunk and then looks at async_error must find it there.
  auto fail = [&](CUresult r) {
    OpResult result = call.done(r);
    if (names_chunk) {
      if (!call.has_reply_slot()) {
        session.post_async_error(r);
        result.post_async_error = false;
      }
      session.finish_chunk(chunk, req.host.generation, r);
    }
    return result;
  };
  HostBytes host;
  if (!resolve_host(session, req.host, req.bytes, host) ||
      !owns_memory(call, req.device, req.bytes)) {
    return fail(CUDA_ERROR_INVALID_VALUE);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return fail(error);
  // A graph must never hold a staging chunk's address: the chunk is reused by the next copy.
  // The real driver refuses pageable copies in a capture the same way.
  if (host.chunk && capturing(session, *stream)) return fail(refuse_in_capture(session, *stream));
  open_busy_span(session, stream->stream);
  const DriverTable& cu = call.cu;
  CUresult r = to_device
                   ? cu.cuMemcpyHtoDAsync_v2(req.device, host.pointer, req.bytes, stream->stream)
                   : cu.cuMemcpyDtoHAsync_v2(host.pointer, req.device, req.bytes, stream->stream);
  if (r != CUDA_SUCCESS) return fail(r);
  (to_device ? session.usage.bytes_h2d : session.usage.bytes_d2h) += req.bytes;
  if (!host.chunk) return finish_on_stream(call, *stream, r);

  Completion completion;
  completion.chunk = chunk;
  completion.generation = req.host.generation;
  completion.op = call.op();
  if (call.reply_when_done()) completion.slot = call.header.reply_slot;
  if (CUresult recorded = session.complete_after(stream->stream, std::move(completion));
      recorded != CUDA_SUCCESS) {
    return fail(recorded);
  }
  return call.reply_when_done() ? call.deferred() : call.done();
}

}  // namespace

OpResult op_host_register(Call& call) {
  auto req = call.request<proto::HostRegisterReq>();
  Session& session = call.session;
  auto stashed = take_stashed_fd(session, req.token, proto::MessageKind::kHostMemory);
  if (!stashed) return call.done(stashed.error());
  if (!within_client_limit(session, ClientLimit::kPinnedBytes,
                           held_of(session, ClientLimit::kPinnedBytes), req.bytes)) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  struct stat st {};
  if (req.bytes == 0 || ::fstat(stashed->fd.get(), &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) < req.bytes) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const std::uint64_t mapped = (req.bytes + page_size() - 1) / page_size() * page_size();
  // Client address 0: this server picks the address in its pinned window and the client maps
  // there too. Without a window here, anywhere (the client then maps anywhere as well).
  // A client address inside another GPU's slice: memory that GPU's server placed, used on this
  // GPU too; mapped at the same address here.
  PinnedWindow* window = session.gpu().pinned.get();
  void* address = nullptr;
  bool in_window = false;
  if (window != nullptr && req.client_address == 0) {
    address = window->map(stashed->fd.get(), mapped);
    in_window = true;
  } else if (window != nullptr &&
             (address = window->map_foreign(stashed->fd.get(), req.client_address, mapped))) {
    in_window = true;
  } else {
    address = map_region(stashed->fd.get(), req.client_address, mapped);
  }
  if (address == nullptr) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  auto unmap = [&] {
    if (in_window) {
      window->unmap(address, mapped);
    } else {
      ::munmap(address, mapped);
    }
  };
  const DriverTable& cu = call.cu;
  if (CUresult r = cu.cuMemHostRegister_v2(
          address, req.bytes, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
      r != CUDA_SUCCESS) {
    unmap();
    return call.done(r);
  }
  CUdeviceptr device = 0;
  if (CUresult r = cu.cuMemHostGetDevicePointer_v2(&device, address, 0); r != CUDA_SUCCESS) {
    cu.cuMemHostUnregister(address);
    unmap();
    return call.done(r);
  }
  std::uint64_t id =
      session.objects.insert(HostRegionObj{address, req.bytes, mapped, device, in_window});
  if (id == 0 || !session.memory.add(DeviceRange{device, req.bytes, RangeKind::kPinned, id})) {
    if (id != 0) session.objects.take<HostRegionObj>(id);
    cu.cuMemHostUnregister(address);
    unmap();
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  session.usage.pinned_bytes += req.bytes;
  const auto host = reinterpret_cast<std::uint64_t>(address);
  const bool same = in_window || host == req.client_address;
  log_debug("{} registered {} of pinned host memory{}", session.who(), format_bytes(req.bytes),
            same ? "" : " (mapped at another address than the client's)");
  return call.reply(
      proto::HostRegisterRep{id, device, req.client_address == 0 && in_window ? host : 0});
}

OpResult op_host_unregister(Call& call) {
  auto req = call.request<proto::HostUnregisterReq>();
  Session& session = call.session;
  auto region = session.objects.take<HostRegionObj>(req.region);
  if (!region) return call.done(CUDA_ERROR_INVALID_VALUE);
  session.memory.remove(region->device);
  session.usage.pinned_bytes -= std::min(session.usage.pinned_bytes, region->bytes);
  Retired bundle;
  bundle.regions.push_back(*region);
  return call.done(retire(session, std::move(bundle)));
}

OpResult op_copy_htod(Call& call) {
  return copy_host(call, true);
}
OpResult op_copy_dtoh(Call& call) {
  return copy_host(call, false);
}

}  // namespace mpsshim::server

#include "broker/server/driver/shared_segment.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

namespace mpsshim::server {

tl::expected<SharedSegment, std::string> SharedSegment::create(
    const std::string& name, const proto::SegmentGeometry& geometry) {
  const proto::SegmentHeader header = proto::plan_segment(geometry);
  SharedSegment segment;
  segment.fd_.reset(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!segment.fd_) return tl::unexpected(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (::ftruncate(segment.fd_.get(), static_cast<off_t>(header.segment_bytes)) != 0) {
    return tl::unexpected(fmt::format("sizing the session segment to {} bytes: {}",
                                      header.segment_bytes, std::strerror(errno)));
  }
  void* base = ::mmap(nullptr, header.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      segment.fd_.get(), 0);
  if (base == MAP_FAILED) {
    return tl::unexpected(fmt::format("mapping the session segment: {}", std::strerror(errno)));
  }
  segment.view_.base = static_cast<std::byte*>(base);
  segment.view_.geometry = header;
  std::memcpy(base, &header, sizeof header);
  new (segment.view_.control()) proto::SessionControl{};
  proto::ring_init(segment.view_.ring(), header.ring_capacity);
  // Slots and chunk states start as zero bytes, which is kSlotIdle / generation 0.
  if (::fcntl(segment.fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return tl::unexpected(fmt::format("sealing the session segment: {}", std::strerror(errno)));
  }
  return segment;
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : fd_(std::move(other.fd_)), view_(std::exchange(other.view_, proto::SegmentView{})) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    view_ = std::exchange(other.view_, proto::SegmentView{});
  }
  return *this;
}

SharedSegment::~SharedSegment() {
  unmap();
}

void SharedSegment::unmap() {
  if (view_.base != nullptr) ::munmap(view_.base, view_.geometry.segment_bytes);
  view_.base = nullptr;
}

}  // namespace mpsshim::server

// The sealed memfd of one session: header, session control, request ring, reply slots, chunk
// states and the staging area, laid out by proto::plan_segment. The server keeps its own copy
// of the geometry and never reads it back from shared memory.
#pragma once

#include <cstddef>
#include <string>
#include <tl/expected.hpp>

#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

class SharedSegment {
 public:
  // memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING), sized, mapped, header written, ring
  // initialized, then sealed against shrinking, growing and further sealing, so the client
  // can neither take pages away from under the server nor resize what both map.
  static tl::expected<SharedSegment, std::string> create(const std::string& name,
                                                         const proto::SegmentGeometry& geometry);

  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  const proto::SegmentView& view() const { return view_; }
  const proto::SegmentHeader& geometry() const { return view_.geometry; }
  int fd() const { return fd_.get(); }
  void close_fd() { fd_.reset(); }  // once the client has its copy

  std::byte* staging() const { return view_.base + view_.geometry.staging_offset; }
  std::size_t staging_bytes() const {
    return std::size_t{view_.geometry.chunk_count} * view_.geometry.chunk_bytes;
  }

 private:
  void unmap();

  proto::UniqueFd fd_;
  proto::SegmentView view_{};
};

}  // namespace mpsshim::server

// Payload of the stream attribute opcode (Op 116): cuStreamGetAttribute, cuStreamSetAttribute and
// cuStreamCopyAttributes for the attributes the server's driver keeps (an access policy window,
// the memory synchronization domain and its map). The shim answers the priority and the
// synchronization policy itself (libshim/stream_attributes.cpp).
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

enum class StreamAttributeMode : std::uint32_t { kGet = 0, kSet = 1, kCopy = 2 };

struct StreamAttributeReq {
  WireHandle stream;   // get and set: the stream; copy: the destination
  WireHandle source;   // copy: the stream whose attributes are copied; else 0
  std::uint32_t mode;  // StreamAttributeMode
  std::uint32_t reserved;
  WireLaunchAttribute attribute;  // get: its id; set: id and value; copy: unused
};

static_assert(kWireSafe<StreamAttributeReq> && sizeof(StreamAttributeReq) == 96);

}  // namespace mpsshim::proto

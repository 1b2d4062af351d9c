// One ring record being executed: its header and private payload copy, the session it came
// from, and the reply it builds. Op handlers (ops/*.cpp) take a Call and say how it ended.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "broker/server/session/session.hpp"
#include "proto/ops.hpp"

namespace mpsshim::server {

struct OpResult {
  enum class Kind : std::uint8_t {
    kDone,       // answer now with status (and reply bytes)
    kDeferred,   // a completion answers later
    kMalformed,  // the record breaks the protocol: the session ends
    kEnd,        // the client said goodbye: answer, then end the session
  };
  Kind kind = Kind::kDone;
  CUresult status = CUDA_SUCCESS;
  std::uint32_t reply_bytes = 0;
  // False when the handler already stored a one-way call's error in async_error itself (it
  // had to be there before a staging chunk was handed back).
  bool post_async_error = true;
  std::string why;  // kMalformed / kEnd: for the log
};

class Call {
 public:
  // Larger than any legal trailing part (launch arguments and attributes, names).
  static constexpr std::uint64_t kMaxTrailing = 1u << 20;

  Call(Session& session, const proto::RecordHeader& header, std::span<const std::byte> payload)
      : session(session), cu(session.cu()), header(header), payload(payload) {}

  Session& session;
  const DriverTable& cu;
  const proto::RecordHeader header;
  const std::span<const std::byte>
      payload;  // private, 16-byte aligned; the record after its header

  // The request struct; the dispatcher checked that the payload holds one.
  template <typename T>
  T request() const {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, payload.data(), sizeof(T));
    return value;
  }

  // True if the record is exactly the request struct plus `trailing` bytes (padded to the
  // record alignment): every trailing length a client states must match what it sent.
  bool exact(std::size_t request_bytes, std::uint64_t trailing) const {
    if (trailing > kMaxTrailing) return false;
    return header.size == proto::record_bytes(request_bytes + trailing);
  }
  std::span<const std::byte> trailing(std::size_t offset, std::size_t bytes) const {
    return payload.subspan(offset, bytes);
  }

  bool has_reply_slot() const { return header.reply_slot != proto::kNoReply; }
  bool reply_when_done() const {
    return has_reply_slot() && (header.flags & proto::kFlagReplyWhenDone) != 0;
  }
  proto::Op op() const { return static_cast<proto::Op>(header.opcode); }

  template <typename T>
  OpResult reply(const T& value, std::size_t bytes = sizeof(T)) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= proto::kSlotPayloadBytes);
    std::memcpy(reply_buffer, &value, bytes);
    OpResult result;
    result.reply_bytes = static_cast<std::uint32_t>(bytes);
    return result;
  }
  OpResult done(CUresult status = CUDA_SUCCESS) {
    OpResult result;
    result.status = status;
    return result;
  }
  OpResult deferred() {
    OpResult result;
    result.kind = OpResult::Kind::kDeferred;
    return result;
  }
  OpResult malformed(std::string why) {
    OpResult result;
    result.kind = OpResult::Kind::kMalformed;
    result.status = CUDA_ERROR_INVALID_VALUE;
    result.why = std::move(why);
    return result;
  }

  alignas(16) std::byte reply_buffer[proto::kSlotPayloadBytes];
};

// Helpers shared by the op handlers (ops/common.cpp).

// The client's stream, ordered per legacy semantics; nullptr (and *error set) if the id does
// not name one of the client's streams. queues_work: the call adds work to the stream.
StreamObj* use_stream(Call& call, proto::WireHandle id, bool queues_work, CUresult* error);

// Ends a call that queued work on a stream: issue failed -> that error; kFlagReplyWhenDone ->
// answered when the stream reaches this point; otherwise answered now.
OpResult finish_on_stream(Call& call, StreamObj& stream, CUresult issued);

// The client named something that is not its own (a handle or device memory of another client,
// a stale one, or a made-up one): the request is refused, and the first time per session the
// log says so at warn level (`what`: "stream 0x1234", "device memory 0x7e00..+4096").
void note_not_owned(Call& call, std::string_view what);

// [p, p + n) lies in the client's own device memory (allocation_map.hpp); otherwise noted.
bool owns_memory(Call& call, std::uint64_t p, std::uint64_t n);

// A function or kernel handle as something cuLaunchKernelEx and the occupancy calls take.
// Kernels are context-independent: the driver takes a CUkernel where a CUfunction goes.
// for_occupancy: use cuKernelGetFunction's function, which the occupancy calls need.
CUresult resolve_function(Call& call, proto::WireHandle id, bool for_occupancy, CUfunction* out);

// A new id for a driver object, or the id it already has (the driver returns the same handle
// for the same name again).
template <typename T>
std::uint64_t remember(Session& session, void* driver_handle, T object) {
  auto it = session.ids_by_driver_handle.find(driver_handle);
  if (it != session.ids_by_driver_handle.end()) return it->second;
  std::uint64_t id = session.objects.insert(std::move(object));
  if (id != 0) session.ids_by_driver_handle.emplace(driver_handle, id);
  return id;
}

// Stream priority the client asked for, biased by its session priority and clamped to the
// device's range (lower numbers are higher priorities).
int effective_priority(const Session& session, int asked);

// Refuses `asked` bytes of device memory (`what`: "device memory", "a CUDA array", ...) that
// would take the client past its memory limit: OUT_OF_MEMORY, and a log line that names the
// limit and how to change it.
OpResult refuse_over_limit(Call& call, std::uint64_t asked, std::string_view what,
                           MemoryLimitHit hit = MemoryLimitHit::kClient);

}  // namespace mpsshim::server

// A client that speaks mpsshim's protocol itself (proto/), without the shim: what a hostile
// program could send. It attaches through mpsshimd as the shim does, then writes ring records,
// socket messages and shared-memory fields as it likes.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "proto/control.hpp"
#include "proto/ops.hpp"
#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::hostile {

// The answer to a hello that did not open a session: a refusal's code and text, or nothing
// (the peer closed the connection).
struct HelloAnswer {
  bool welcomed = false;
  std::uint32_t kind = 0;  // 0: closed without an answer
  int cuda_error = 0;
  std::string message;
};

// Sends `bytes` (with `fds`) as the first message on a fresh connection to the daemon and
// reads the answer.
HelloAnswer send_first_message(const std::string& socket_path, std::span<const std::byte> bytes,
                               std::span<const int> fds = {});

// A well-formed attach hello for device 0.
proto::ClientHello attach_hello(const char* program);

struct Reply {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::vector<std::byte> payload;
  template <typename T>
  T as() const {
    T value{};
    std::memcpy(&value, payload.data(), std::min(sizeof value, payload.size()));
    return value;
  }
};

class WireClient {
 public:
  // Attaches to GPU 0 through the daemon's socket; throws std::runtime_error when refused.
  explicit WireClient(const std::string& socket_path, const char* program = "hostile");
  ~WireClient();
  WireClient(const WireClient&) = delete;
  WireClient& operator=(const WireClient&) = delete;

  // ---- raw access ------------------------------------------------------------------------
  proto::SegmentView& view() { return view_; }
  proto::RingControl& ring() { return *view_.ring(); }
  int socket() const { return socket_.get(); }
  // Writes a record of `opcode` with `payload` (padded), publishes it and rings the doorbell
  // when the server sleeps. `declared_size` (0: the real one) is what the header claims.
  // False when the ring stayed full for `patience`.
  bool post(std::uint16_t opcode, std::span<const std::byte> payload,
            std::uint32_t slot = proto::kNoReply, std::uint32_t declared_size = 0,
            std::chrono::milliseconds patience = std::chrono::seconds(5));
  void ring_doorbell();
  // The reply in slot 0, once the server answered (nullopt after `timeout` or the session end).
  std::optional<Reply> wait_reply(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // ---- calls as the shim makes them --------------------------------------------------------
  template <typename Req>
  Reply call(proto::Op op, const Req& req) {
    return call_bytes(op, std::as_bytes(std::span<const Req, 1>(&req, 1)));
  }
  Reply call_bytes(proto::Op op, std::span<const std::byte> payload);
  template <typename Req>
  bool one_way(proto::Op op, const Req& req) {
    return post(static_cast<std::uint16_t>(op), std::as_bytes(std::span<const Req, 1>(&req, 1)));
  }
  // Sends a memfd on the socket under `token` (FdTransfer); `fds` overrides the one memfd.
  bool send_fd(proto::MessageKind kind, std::uint32_t token, int fd, std::uint64_t bytes);

  // The session's first context and its default stream (CtxCreate).
  void create_context();
  std::uint64_t ctx() const { return ctx_; }
  std::uint64_t default_stream() const { return stream_; }
  // Staged copies through chunk 0, waited for; the result of the copy.
  CUresult copy_in(std::uint64_t device, std::span<const std::byte> bytes);
  CUresult copy_out(std::uint64_t device, std::span<std::byte> bytes);

  // The server ended the session: a fault in the control block or a hang-up within `timeout`.
  // Returns the fault code (CUDA_ERROR_MPS_CONNECTION_FAILED for a bare hang-up).
  std::optional<CUresult> wait_for_end(
      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  std::uint64_t records_executed() const {
    return view_.control()->records_executed.load(std::memory_order_acquire);
  }

 private:
  proto::UniqueFd socket_;
  proto::UniqueFd doorbell_;
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  proto::SegmentView view_;
  proto::RingProducer producer_;
  std::uint64_t ctx_ = 0;
  std::uint64_t stream_ = 0;
  std::uint32_t chunk_generation_ = 0;
};

}  // namespace mpsshim::hostile

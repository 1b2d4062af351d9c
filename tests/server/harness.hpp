// A server on the fake driver, in-process, and clients that talk to it through a real session
// segment and ring, as the shim does. Tests run the server's loop by hand (pump), or start it
// threaded (start_threaded: Server::run on a thread of its own, with its worker threads); then
// clients are admitted through the control socket, as the daemon admits them, and may be used
// from threads of their own.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "broker/server/core/server.hpp"
#include "proto/control.hpp"
#include "proto/ops.hpp"
#include "proto/unix_socket.hpp"
#include "tests/server/fake_driver.hpp"

namespace mpsshim::server::test {

class Harness {
 public:
  explicit Harness(ServerSettings settings = {});
  // On another driver than the fake one (the test driver, for tests that need real semantics).
  Harness(const DriverTable& driver, ServerSettings settings);
  ~Harness();

  // Runs passes of the loop until pred() holds or two seconds pass; returns pred(). Threaded:
  // waits (the server runs on its own threads) until pred() holds or `threaded_timeout` passes.
  bool pump_until(const std::function<bool()>& pred);
  void pump(int passes = 8);

  // Any thread: the log sink may be called by the server's worker threads.
  bool logged(const std::string& fragment) const;
  std::size_t count_logged(const std::string& fragment) const;
  std::vector<std::string> log_lines() const;

  // Threaded mode: Server::run on a thread of its own until stop_threaded(), which returns
  // run's exit code (-1 if it was not running).
  void start_threaded();
  int stop_threaded();
  bool threaded() const { return runner_.joinable(); }
  // Threaded mode, any thread: sends a message (with fds) on the daemon's end of the control
  // socket. One sender at a time.
  int send_to_server(std::span<const std::byte> bytes, std::span<const int> fds = {});
  // Threaded mode, one thread at a time: an operator request as the daemon sends it, and the
  // server's answer (nullopt when none came within `threaded_timeout`).
  struct Answer {
    proto::MessageKind kind{};
    int status = 0;
    std::string text;
  };
  std::optional<Answer> operator_request(proto::MessageKind kind, const std::string& text);

  DriverTable table;
  Gpu gpu;
  proto::UniqueFd daemon;  // the daemon's end of the control socket
  std::unique_ptr<Server> server;
  // Inline mode only: threaded tests read the log through log_lines() / logged().
  std::vector<std::string> logs;
  int fatal_code = -1;
  std::chrono::milliseconds threaded_timeout{60'000};

 private:
  mutable std::mutex log_mutex_;
  std::mutex daemon_mutex_;
  std::atomic<bool> stop_{false};
  std::thread runner_;
  int run_code_ = -1;
};

// The host-memory test driver (MPSSHIM_TESTDRIVER_LIB, set by meson test), loaded once, and how
// many objects it holds (what a test leaks shows here).
const DriverTable& test_driver();
int live_driver_objects();

// The test driver's objects split the way a session's end is checked: the green contexts apart,
// because the server keeps those of finished sessions for the next ones (green_context_pool.hpp).
struct DriverObjects {
  int green_contexts = 0;
  int others = 0;
  bool operator==(const DriverObjects&) const = default;
};
DriverObjects driver_objects();
inline std::ostream& operator<<(std::ostream& out, const DriverObjects& objects) {
  return out << objects.green_contexts << " green context(s) and " << objects.others
             << " other object(s)";
}
// `before` and the green contexts `server`'s pool keeps now: what the driver holds once every
// session that came after `before` has been freed. A leaked green context or anything else
// shows as a difference.
DriverObjects with_pooled(DriverObjects before, const Server& server);

proto::ClientHello default_hello(int pid = 4123, const char* program = "vector_add");
// What the daemon sends the server for a client with this hello (uid and gid 1000).
proto::ServerAdmit admission_of(const proto::ClientHello& hello);

struct Reply {
  CUresult result = CUDA_SUCCESS;
  std::vector<std::byte> payload;

  template <typename T>
  T as() const {
    T value{};
    if (!payload.empty()) std::memcpy(&value, payload.data(), std::min(sizeof(T), payload.size()));
    return value;
  }
};

class TestClient {
 public:
  // Inline mode: admitted by a direct call. Threaded mode: through the control socket, as
  // the daemon admits clients (any thread; waits for the welcome).
  explicit TestClient(Harness& harness, const proto::ClientHello& hello = default_hello());
  // With the daemon's admission as given (an allocation's fields, say).
  TestClient(Harness& harness, const proto::ServerAdmit& admit);
  ~TestClient();

  bool connected() const { return base_ != nullptr; }
  const proto::SessionWelcome& welcome() const { return welcome_; }
  const proto::SegmentView& view() const { return view_; }
  proto::SessionControl* control() const { return view_.control(); }
  int socket() const { return socket_.get(); }
  void hang_up() { socket_.reset(); }

  // Writes one record and commits it.
  void send_raw(std::uint16_t opcode, std::span<const std::byte> payload, std::uint32_t slot,
                std::uint16_t flags = 0, std::uint32_t size_override = 0);
  template <typename Req>
  void send(proto::Op op, const Req& req, std::uint32_t slot = proto::kNoReply,
            std::span<const std::byte> trailing = {}, std::uint16_t flags = 0) {
    std::vector<std::byte> bytes(sizeof(Req) + trailing.size());
    std::memcpy(bytes.data(), &req, sizeof(Req));
    if (!trailing.empty())
      std::memcpy(bytes.data() + sizeof(Req), trailing.data(), trailing.size());
    send_raw(static_cast<std::uint16_t>(op), bytes, slot, flags);
  }
  void send_empty(proto::Op op, std::uint32_t slot = proto::kNoReply) {
    send_raw(static_cast<std::uint16_t>(op), {}, slot);
  }

  // The answer in `slot`, once the server wrote it (pumping the loop); the slot is idle again.
  // Threaded mode: also gives up (nullopt) once the session holds a fault (the client was
  // terminated or the server stopped), as the shim's waits do.
  std::optional<Reply> reply(std::uint32_t slot = 0);
  bool slot_ready(std::uint32_t slot) const;

  // Sends a request on slot 0 and waits for its answer.
  template <typename Req>
  Reply call(proto::Op op, const Req& req, std::span<const std::byte> trailing = {}) {
    send(op, req, 0, trailing);
    return reply(0).value_or(Reply{CUDA_ERROR_UNKNOWN, {}});
  }
  Reply call_empty(proto::Op op) {
    send_empty(op, 0);
    return reply(0).value_or(Reply{CUDA_ERROR_UNKNOWN, {}});
  }

  // Conveniences used by many tests.
  proto::CtxCreateRep create_context();
  std::uint64_t alloc(std::uint64_t ctx, std::uint64_t bytes, CUresult* result = nullptr);
  // An FdTransfer with a memfd of `bytes` holding `content`.
  void send_memfd(proto::MessageKind kind, std::uint32_t token, std::uint64_t bytes,
                  std::span<const std::byte> content = {});

 private:
  Harness& harness_;
  proto::UniqueFd socket_;
  proto::UniqueFd doorbell_;  // rung when a commit finds the server's worker asleep
  proto::SessionWelcome welcome_{};
  void* base_ = nullptr;
  proto::SegmentView view_{};
  proto::RingProducer ring_;
};

}  // namespace mpsshim::server::test

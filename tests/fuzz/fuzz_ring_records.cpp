// libFuzzer target: arbitrary ring records from one client, executed by the server against the
// fake driver table of tests/server (docs/testing.md, "Fuzzing").
//
// Every input gets a fresh Harness (server, fake GPU, log) and one fresh session, so one input's
// state cannot make a later input's crash irreproducible: a crash reproduces from its input
// alone. A session's handles are numbered from the same start each time, so the fuzzer can learn
// them (e.g. a MemFree of what the input's MemAlloc returned).
//
// The input is a list of commands, each starting with a kind byte:
//   0xFF  a memfd on the client's socket (FdTransfer): u8 message kind, u32 token, u16 length,
//         then that many content bytes (an image for kImageLoad, or host memory).
//   0xFE  the client rewrites the ring's head by a signed 16-bit amount (a corrupted ring).
//   other a record: the byte is the opcode's low 8 bits, then u8 opcode high bits, u16 flags,
//         u8 reply slot (0xFF: kNoReply; else taken modulo slot_count + 1, so one past the last
//         slot too), u16 payload length, u8 size mode (odd: the next u32 is written as the
//         header's size instead of the true one), then the payload bytes.
// (Opcodes whose low byte is 0xFE or 0xFF, all unknown, are never sent.) Missing bytes read as
// zero; a length longer than what is left takes what is left. Driver calls the fake table
// lacks answer CUDA_ERROR_NOT_SUPPORTED (fuzz_driver below).
//
// After each command the server's loop runs until the ring is drained (or the session is
// gone); at the end the client hangs up and the server must free the session. A session that
// is never freed, a crash, a leak or undefined behaviour is a finding; a malformed input must
// end at most its own session. MPSSHIM_FUZZ_LOG=1 prints the server's log (one input:
// fuzz_ring_records FILE).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "tests/server/harness.hpp"

namespace {

using namespace mpsshim;
using namespace mpsshim::server;

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> data) : data_(data) {}
  bool done() const { return at_ >= data_.size(); }
  template <typename T>
  T take() {
    T value{};
    std::size_t n = std::min(sizeof(T), data_.size() - at_);
    std::memcpy(&value, data_.data() + at_, n);
    at_ += n;
    return value;
  }
  std::span<const std::byte> bytes(std::size_t n) {
    n = std::min(n, data_.size() - at_);
    auto out = std::as_bytes(data_.subspan(at_, n));
    at_ += n;
    return out;
  }

 private:
  std::span<const std::uint8_t> data_;
  std::size_t at_ = 0;
};

bool ring_drained(const test::TestClient& client) {
  const proto::RingControl* ring = client.view().ring();
  return ring->head.load(std::memory_order_acquire) == ring->tail.load(std::memory_order_acquire);
}

// Runs the loop until the session is gone or its ring is drained and nothing else moves.
void settle(test::Harness& h, test::TestClient& client) {
  const std::uint32_t id = client.welcome().client_id;
  int idle = 0;
  for (int pass = 0; pass < 10'000 && idle < 3; ++pass) {
    if (h.fatal_code != -1 || h.server->find_session(id) == nullptr) return;
    std::size_t work = h.server->do_work();
    idle = (work == 0 && ring_drained(client)) ? idle + 1 : 0;
  }
}

// The fake table leaves out what tests/server runs on the test driver instead (capture, some
// graph calls): null there, which the real driver never is (load_driver needs every entry).
// Here every missing entry answers CUDA_ERROR_NOT_SUPPORTED.
template <typename... Args>
void fill(CUresult(CUDAAPI*& entry)(Args...)) {
  if (entry == nullptr) entry = [](Args...) { return CUDA_ERROR_NOT_SUPPORTED; };
}

const DriverTable& fuzz_driver() {
  static const DriverTable table = [] {
    DriverTable t = test::fake_driver_table();
#define MPSSHIM_FILL(name, ret, params) fill(t.name);
    MPSSHIM_DRIVER_FUNCTIONS(MPSSHIM_FILL)
#undef MPSSHIM_FILL
    return t;
  }();
  return table;
}

// A small segment (fast to make for every input) and a memory limit: the fake driver backs
// device memory with host memory, and a client may ask for all of its 80 GiB.
ServerSettings fuzz_settings() {
  ServerSettings settings;
  settings.default_memory_limit = std::uint64_t{64} << 20;
  settings.geometry.ring_capacity = 256u << 10;
  settings.geometry.slot_count = 16;
  settings.geometry.chunk_count = 2;
  settings.geometry.chunk_bytes = 64u << 10;
  return settings;
}

void run_input(std::span<const std::uint8_t> data) {
  test::Harness h(fuzz_driver(), fuzz_settings());
  // The log is formatted (its arguments are part of what is fuzzed) but not kept, unless
  // MPSSHIM_FUZZ_LOG is set (to see what an input does).
  static const bool show_log = std::getenv("MPSSHIM_FUZZ_LOG") != nullptr;
  set_log_sink([](LogLevel, std::string_view line) {
    if (show_log) std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  });
  test::TestClient client(h);
  if (!client.connected()) {
    std::fprintf(stderr, "fuzz_ring_records: the client was not admitted\n");
    std::abort();
  }
  const std::uint32_t id = client.welcome().client_id;
  const std::uint32_t slot_count = client.view().geometry.slot_count;

  Reader in(data);
  while (!in.done() && h.fatal_code == -1 && h.server->find_session(id) != nullptr) {
    const auto kind = in.take<std::uint8_t>();
    if (kind == 0xFF) {
      const auto message = in.take<std::uint8_t>();
      const auto token = in.take<std::uint32_t>();
      const auto length = in.take<std::uint16_t>();
      auto content = in.bytes(length);
      client.send_memfd(static_cast<proto::MessageKind>(message), token, content.size(), content);
      // The session reads its socket at most every 100 us.
      std::this_thread::sleep_for(std::chrono::microseconds(120));
    } else if (kind == 0xFE) {
      const auto delta = in.take<std::int16_t>();
      proto::RingControl* ring = client.view().ring();
      ring->head.fetch_add(static_cast<std::uint64_t>(static_cast<std::int64_t>(delta)),
                           std::memory_order_release);
    } else {
      const auto opcode = static_cast<std::uint16_t>(kind | (in.take<std::uint8_t>() << 8));
      const auto flags = in.take<std::uint16_t>();
      const auto slot_byte = in.take<std::uint8_t>();
      const auto length = in.take<std::uint16_t>();
      const auto size_mode = in.take<std::uint8_t>();
      std::uint32_t size_override = 0;
      if ((size_mode & 1) != 0) size_override = in.take<std::uint32_t>();
      auto payload = in.bytes(length);
      const std::uint32_t slot = slot_byte == 0xFF ? proto::kNoReply : slot_byte % (slot_count + 1);
      // An answer the client never read keeps its slot busy: a reuse is the client's mistake,
      // which the server must handle too, so slots are not reset here.
      try {
        client.send_raw(opcode, payload, slot, flags, size_override);
      } catch (const std::runtime_error&) {
        break;  // the ring is full: the server stopped reading it
      }
    }
    settle(h, client);
  }

  if (show_log) {
    for (std::uint32_t i = 0; i < std::min<std::uint32_t>(slot_count, 8); ++i) {
      const proto::ResponseSlot* answer = client.view().slot(i);
      std::uint64_t first = 0;
      std::memcpy(&first, answer->payload, sizeof first);
      std::fprintf(stderr, "slot %u: state %u result %d payload %u bytes, first u64 %#llx\n", i,
                   answer->state.load(), answer->result, answer->payload_bytes,
                   static_cast<unsigned long long>(first));
    }
  }

  // The client goes away; the server must free its session whatever state it was left in.
  client.hang_up();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.fatal_code == -1 && h.server->find_session(id) != nullptr) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "fuzz_ring_records: the session was not freed after its client left\n");
      std::abort();
    }
    if (h.server->do_work() == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  run_input(std::span(data, size));
  return 0;
}

// libFuzzer target: the first message a peer sends on the control socket, as the daemon reads
// it (proto/unix_socket's codec, broker/daemon/wire.hpp's header and struct decoding, the
// ClientHello checks of the client gate: CUDA_VISIBLE_DEVICES resolution, the attach ordinal,
// an mpsshimctl request's text; the quota decided from its allocation token, which must never
// pass the allocation's or the node's caps), then the hello in a kServerAdmit to a server on the
// fake driver (broker/server/core/admit.cpp), which must admit or refuse it; an admitted session
// must be freed when its client hangs up (docs/testing.md, "Fuzzing").
//
// Every input gets a fresh server (tests/server/harness.hpp), so a crash reproduces from its
// input alone.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "broker/daemon/allocation_quota.hpp"
#include "broker/daemon/visible_devices.hpp"
#include "broker/daemon/wire.hpp"
#include "common/log.hpp"
#include "proto/unix_socket.hpp"
#include "tests/server/harness.hpp"

namespace {

using namespace mpsshim;

void fail(const char* what) {
  std::fprintf(stderr, "fuzz_control_messages: %s\n", what);
  std::abort();
}

// Three GPUs, the last one's UUID not known yet, as the daemon may see them.
std::vector<std::optional<daemon::GpuUuid>> gpus() {
  std::vector<std::optional<daemon::GpuUuid>> uuids;
  for (std::uint8_t g = 0; g < 2; ++g) {
    daemon::GpuUuid uuid{};
    for (std::size_t i = 0; i < uuid.size(); ++i) uuid[i] = static_cast<std::uint8_t>(g * 16 + i);
    uuids.emplace_back(uuid);
  }
  uuids.emplace_back(std::nullopt);
  return uuids;
}

// What the daemon does with a first message (client_gate.cpp, device_directory.cpp).
std::optional<proto::ClientHello> daemon_reads(const proto::Received& message) {
  auto header = daemon::header_of(message);
  if (!header) return std::nullopt;
  auto kind = static_cast<proto::MessageKind>(header->kind);
  if (kind == proto::MessageKind::kCtlRequest) {
    if (auto request = daemon::decode<proto::TextMessage>(message)) {
      std::string line = daemon::text_of(*request);
      if (line.size() > sizeof request->text) fail("text_of is longer than the message");
    }
    return std::nullopt;
  }
  if (kind != proto::MessageKind::kClientQuery && kind != proto::MessageKind::kClientAttach) {
    return std::nullopt;
  }
  // A 1.0-1.3 hello is shorter; what it did not send reads as zero (client_gate.cpp).
  if (message.bytes.size() < proto::kClientHelloSizeBeforeTokens) return std::nullopt;
  std::optional<proto::ClientHello> hello = proto::ClientHello{};
  std::memcpy(&*hello, message.bytes.data(), std::min(message.bytes.size(), sizeof *hello));
  hello->visible_devices[sizeof hello->visible_devices - 1] = '\0';
  hello->program[sizeof hello->program - 1] = '\0';
  hello->allocation_token[sizeof hello->allocation_token - 1] = '\0';
  static const auto uuids = gpus();
  std::vector<int> visible =
      daemon::resolve_visible_devices(daemon::bounded_string(hello->visible_devices), uuids);
  for (std::size_t i = 0; i < visible.size(); ++i) {
    if (visible[i] < 0 || static_cast<std::size_t>(visible[i]) >= uuids.size()) {
      fail("resolve_visible_devices named a GPU that does not exist");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (visible[i] == visible[j]) fail("resolve_visible_devices named a GPU twice");
    }
  }
  (void)daemon::format_gpu_uuid(hello->program[0] == 0 ? *uuids[0] : *uuids[1]);
  return hello;
}

// The quota the daemon decides (allocation_quota.cpp), against one known allocation and a node
// that requires tokens; what it decides must never be more than the allocation allows.
std::optional<daemon::AdmissionQuota> daemon_decides(const proto::ClientHello& hello) {
  static daemon::AllocationRegistry registry = [] {
    daemon::AllocationRegistry r;
    r.tokens_required = true;
    if (!r.add({"sm=25", "memory=64M", "gpus=0", "slot=1/4",
                "token=0123456789abcdef0123456789abcdef"})) {
      fail("register_allocation");
    }
    return r;
  }();
  daemon::ServerDefaults defaults;
  defaults.sm_percentage = 50;
  defaults.memory_limit = 128 << 20;
  auto quota = daemon::decide_quota(registry, defaults, hello, 0);
  if (!quota) return std::nullopt;
  const int percentage = quota->hello.active_thread_percentage;
  const int cap = quota->allocation_id != 0 ? 25 : 50;
  if (percentage != proto::kUnset && percentage > cap) fail("a quota above its cap");
  const std::uint64_t memory_cap = quota->allocation_id != 0 ? (64 << 20) : (128 << 20);
  if (quota->hello.device_memory_limit > memory_cap) fail("a memory limit above its cap");
  return *quota;
}

void server_admits(const proto::ClientHello& hello,
                   const std::optional<daemon::AdmissionQuota>& quota) {
  server::test::Harness h;
  set_log_sink([](LogLevel, std::string_view) {});
  proto::UniqueFd client, server_end;
  if (!proto::seqpacket_pair(client, server_end)) fail("socketpair");
  proto::ServerAdmit admit = server::test::admission_of(hello);
  if (quota) {
    admit.allocation_id = quota->allocation_id;
    admit.allocation_memory_limit = quota->allocation_memory_limit;
    admit.allocation_sm_slot = quota->sm_slot;
    admit.allocation_sm_slots = quota->sm_slots;
  }
  h.server->admit(admit, std::move(server_end));
  h.pump(2);
  client.reset();  // admitted or not, the client goes away
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.fatal_code == -1 && h.server->session_count() != 0) {
    if (std::chrono::steady_clock::now() > deadline) fail("the session was not freed");
    if (h.server->do_work() == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Through a real SOCK_SEQPACKET pair, as the daemon receives it.
  static proto::UniqueFd sender, receiver;
  if (!sender && !proto::seqpacket_pair(sender, receiver)) fail("socketpair");
  if (size == 0 || size > 16 * 1024)
    return 0;  // bigger than any first message; the kernel may refuse it
  proto::Received message;
  if (proto::send_message(sender.get(), std::as_bytes(std::span(data, size))) != 0) return 0;
  if (proto::receive_message(receiver.get(), message) != 0) fail("receive_message failed");
  if (message.bytes.size() != size) fail("receive_message changed the message's length");

  if (auto hello = daemon_reads(message)) {
    // The server gets the hello as the daemon forwards it: ABI checked, strings terminated.
    if (hello->header.abi_major == proto::kAbiMajor) {
      auto quota = daemon_decides(*hello);
      server_admits(quota ? quota->hello : *hello, quota);
    }
  }
  return 0;
}

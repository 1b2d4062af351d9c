#include "tests/server/harness.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "broker/server/log.hpp"

namespace mpsshim::server::test {

Harness::Harness(ServerSettings settings) : Harness(fake_driver_table(), settings) {}

Harness::Harness(const DriverTable& driver, ServerSettings settings) {
  fake_gpu().reset();
  table = driver;
  set_log_level(LogLevel::kDebug);
  set_log_sink([this](LogLevel, std::string_view line) { logs.emplace_back(line); });
  auto opened = open_gpu(table, 0);
  if (!opened) throw std::runtime_error(opened.error().message);
  gpu = *opened;
  proto::UniqueFd server_end;
  if (!proto::seqpacket_pair(daemon, server_end)) throw std::runtime_error("socketpair");
  server = std::make_unique<Server>(gpu, settings, std::move(server_end));
  server->set_fatal_handler([this](int code) { fatal_code = code; });
}

Harness::~Harness() {
  server.reset();
  set_log_sink(nullptr);
}

bool Harness::pump_until(const std::function<bool()>& pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (server->do_work() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

void Harness::pump(int passes) {
  for (int i = 0; i < passes; ++i) {
    server->do_work();
    std::this_thread::sleep_for(std::chrono::microseconds(150));  // lets socket polls come due
  }
}

bool Harness::logged(const std::string& fragment) const {
  for (const std::string& line : logs) {
    if (line.find(fragment) != std::string::npos) return true;
  }
  return false;
}

proto::ClientHello default_hello(int pid, const char* program) {
  proto::ClientHello hello{};
  hello.header = proto::make_header(proto::MessageKind::kClientAttach, sizeof hello);
  hello.pid = pid;
  hello.device = 0;
  hello.active_thread_percentage = proto::kUnset;
  hello.priority = proto::kUnset;
  std::strncpy(hello.program, program, sizeof hello.program - 1);
  return hello;
}

TestClient::TestClient(Harness& harness, const proto::ClientHello& hello) : harness_(harness) {
  proto::UniqueFd server_end;
  if (!proto::seqpacket_pair(socket_, server_end)) throw std::runtime_error("socketpair");
  proto::ServerAdmit admit{};
  admit.header = proto::make_header(proto::MessageKind::kServerAdmit, sizeof admit);
  admit.peer_pid = hello.pid;
  admit.peer_uid = 1000;
  admit.peer_gid = 1000;
  admit.hello = hello;
  harness.server->admit(admit, std::move(server_end));

  proto::Received message;
  if (proto::receive_message(socket_.get(), message) != 0 || message.bytes.size() < 16) return;
  proto::HelloHeader header{};
  std::memcpy(&header, message.bytes.data(), sizeof header);
  if (header.kind != static_cast<std::uint32_t>(proto::MessageKind::kSessionWelcome) ||
      message.fds.size() != 2) {
    return;
  }
  std::memcpy(&welcome_, message.bytes.data(), sizeof welcome_);
  base_ = ::mmap(nullptr, welcome_.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                 message.fds[0].get(), 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    return;
  }
  proto::SegmentHeader geometry;
  std::memcpy(&geometry, base_, sizeof geometry);
  if (!proto::segment_header_valid(geometry, welcome_.segment_bytes)) {
    throw std::runtime_error("the server sent an invalid segment header");
  }
  view_ = proto::SegmentView{static_cast<std::byte*>(base_), geometry};
  ring_ = proto::RingProducer(view_.ring(), geometry.ring_capacity);
}

TestClient::~TestClient() {
  if (base_ != nullptr) ::munmap(base_, welcome_.segment_bytes);
}

void TestClient::send_raw(std::uint16_t opcode, std::span<const std::byte> payload,
                          std::uint32_t slot, std::uint16_t flags, std::uint32_t size_override) {
  const std::uint32_t bytes = proto::record_bytes(payload.size());
  std::byte* at = ring_.try_reserve(bytes);
  if (at == nullptr) throw std::runtime_error("ring full");
  // Stamped as libshim stamps: the server measures each record's wait in the ring.
  proto::RecordHeader header{size_override != 0 ? size_override : bytes, opcode, flags, slot,
                             proto::send_stamp_now()};
  std::memcpy(at, &header, sizeof header);
  if (!payload.empty()) std::memcpy(at + sizeof header, payload.data(), payload.size());
  if (slot != proto::kNoReply && slot < view_.geometry.slot_count) {
    view_.slot(slot)->state.store(proto::kSlotPending, std::memory_order_relaxed);
  }
  ring_.commit();
}

bool TestClient::slot_ready(std::uint32_t slot) const {
  return view_.slot(slot)->state.load(std::memory_order_acquire) == proto::kSlotReady;
}

std::optional<Reply> TestClient::reply(std::uint32_t slot) {
  if (!harness_.pump_until([&] { return slot_ready(slot); })) return std::nullopt;
  proto::ResponseSlot* s = view_.slot(slot);
  Reply reply;
  reply.result = static_cast<CUresult>(s->result);
  const auto* payload = reinterpret_cast<const std::byte*>(s->payload);
  reply.payload.assign(payload, payload + std::min(s->payload_bytes, proto::kSlotPayloadBytes));
  s->state.store(proto::kSlotIdle, std::memory_order_relaxed);
  return reply;
}

proto::CtxCreateRep TestClient::create_context() {
  Reply r = call(proto::Op::kCtxCreate, proto::CtxCreateReq{0, 0});
  if (r.result != CUDA_SUCCESS) throw std::runtime_error("CtxCreate failed");
  return r.as<proto::CtxCreateRep>();
}

std::uint64_t TestClient::alloc(std::uint64_t ctx, std::uint64_t bytes, CUresult* result) {
  Reply r = call(proto::Op::kMemAlloc, proto::MemAllocReq{ctx, bytes});
  if (result != nullptr) *result = r.result;
  return r.result == CUDA_SUCCESS ? r.as<proto::MemAllocRep>().dptr : 0;
}

void TestClient::send_memfd(proto::MessageKind kind, std::uint32_t token, std::uint64_t bytes,
                            std::span<const std::byte> content) {
  proto::UniqueFd fd(::memfd_create("test-client", MFD_CLOEXEC));
  if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    throw std::runtime_error("memfd");
  }
  if (!content.empty() && ::pwrite(fd.get(), content.data(), content.size(), 0) < 0) {
    throw std::runtime_error("pwrite");
  }
  proto::FdTransfer transfer{};
  transfer.header = proto::make_header(kind, sizeof transfer);
  transfer.token = token;
  transfer.bytes = bytes;
  const int fds[1] = {fd.get()};
  if (proto::send_struct(socket_.get(), transfer, fds) != 0) throw std::runtime_error("send fd");
}

}  // namespace mpsshim::server::test

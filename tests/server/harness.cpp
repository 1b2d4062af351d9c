#include "tests/server/harness.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <thread>

#include "common/log.hpp"
#include "proto/futex.hpp"

namespace mpsshim::server::test {

const DriverTable& test_driver() {
  static const DriverTable table = [] {
    const char* path = std::getenv("MPSSHIM_TESTDRIVER_LIB");
    if (path == nullptr) throw std::runtime_error("MPSSHIM_TESTDRIVER_LIB is not set");
    auto loaded = load_driver(path);
    if (!loaded) throw std::runtime_error(loaded.error().message);
    return *loaded;
  }();
  return table;
}

int live_driver_objects() {
  void* lib = ::dlopen(std::getenv("MPSSHIM_TESTDRIVER_LIB"), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) throw std::runtime_error("the test driver is not loaded");
  auto count = reinterpret_cast<int (*)()>(::dlsym(lib, "mpsshim_testdriver_live_objects"));
  if (count == nullptr) throw std::runtime_error("the test driver has no object count");
  return count();
}
DriverObjects driver_objects() {
  void* lib = ::dlopen(std::getenv("MPSSHIM_TESTDRIVER_LIB"), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) throw std::runtime_error("the test driver is not loaded");
  auto count = reinterpret_cast<int (*)()>(::dlsym(lib, "mpsshim_testdriver_live_green_contexts"));
  if (count == nullptr) throw std::runtime_error("the test driver has no green context count");
  const int green = count();
  return {green, live_driver_objects() - green};
}

DriverObjects with_pooled(DriverObjects before, const Server& server) {
  before.green_contexts += static_cast<int>(server.green_context_pool().idle);
  // The server's address arena: one reservation for its life (device_heap.hpp).
  if (server.gpu().heap) before.others += 1;
  return before;
}

namespace {

// The status of every part of a long operator answer but the last (an answer longer than one
// TextMessage is sent as several).
constexpr std::int32_t kTextContinues = std::numeric_limits<std::int32_t>::min();

}  // namespace

Harness::Harness(ServerSettings settings) : Harness(fake_driver_table(), settings) {}

Harness::Harness(const DriverTable& driver, ServerSettings settings) {
  fake_gpu().reset();
  table = driver;
  set_log_level(LogLevel::kDebug);
  // Worker threads log too: one line at a time.
  set_log_sink([this](LogLevel, std::string_view line) {
    std::lock_guard lock(log_mutex_);
    logs.emplace_back(line);
  });
  auto opened = open_gpu(table, 0);
  if (!opened) throw std::runtime_error(opened.error().message);
  gpu = *opened;
  proto::UniqueFd server_end;
  if (!proto::seqpacket_pair(daemon, server_end)) throw std::runtime_error("socketpair");
  server = std::make_unique<Server>(gpu, settings, std::move(server_end));
  server->set_fatal_handler([this](int code) { fatal_code = code; });
}

Harness::~Harness() {
  stop_threaded();
  server.reset();
  set_log_sink(nullptr);
}

bool Harness::pump_until(const std::function<bool()>& pred) {
  if (threaded()) {
    // The server's threads do the work; this thread only looks.
    auto deadline = std::chrono::steady_clock::now() + threaded_timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // a poll, not a wait
    }
    return true;
  }
  // Generous: a 2 s deadline failed graph_test.cpp's destroy check once on a CI machine whose
  // two cores were busy with a build; pump_until returns as soon as the condition holds.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
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
  return count_logged(fragment) != 0;
}

std::size_t Harness::count_logged(const std::string& fragment) const {
  std::lock_guard lock(log_mutex_);
  return static_cast<std::size_t>(std::count_if(logs.begin(), logs.end(), [&](const auto& line) {
    return line.find(fragment) != std::string::npos;
  }));
}

std::vector<std::string> Harness::log_lines() const {
  std::lock_guard lock(log_mutex_);
  return logs;
}

void Harness::start_threaded() {
  if (threaded()) return;
  stop_.store(false);
  runner_ = std::thread([this] {
    // As in mpsshim-server, whose main thread opened the GPU: the coordinator admits clients
    // (registers their staging areas) with the primary context current.
    if (gpu.cu->cuCtxSetCurrent(gpu.primary) != CUDA_SUCCESS) return;
    run_code_ = server->run(stop_);
  });
}

int Harness::stop_threaded() {
  if (!threaded()) return -1;
  stop_.store(true);
  // run() looks at the flag each time the coordinator wakes (at the latest every second).
  server->wake();
  runner_.join();
  return run_code_;
}

int Harness::send_to_server(std::span<const std::byte> bytes, std::span<const int> fds) {
  std::lock_guard lock(daemon_mutex_);
  return proto::send_message(daemon.get(), bytes, fds);
}

std::optional<Harness::Answer> Harness::operator_request(proto::MessageKind kind,
                                                         const std::string& text) {
  proto::TextMessage request{};
  request.header = proto::make_header(kind, sizeof request);
  std::size_t n = std::min(text.size(), sizeof request.text - 1);
  std::memcpy(request.text, text.data(), n);
  request.length = static_cast<std::uint32_t>(n);
  if (send_to_server(std::as_bytes(std::span(&request, 1))) != 0) return std::nullopt;
  Answer answer;
  for (;;) {
    pollfd readable{daemon.get(), POLLIN, 0};
    if (::poll(&readable, 1, static_cast<int>(threaded_timeout.count())) != 1) return std::nullopt;
    proto::Received message;
    if (proto::receive_message(daemon.get(), message) != 0) return std::nullopt;
    proto::TextMessage part{};
    if (message.bytes.size() < offsetof(proto::TextMessage, text) ||
        message.bytes.size() > sizeof part) {
      return std::nullopt;
    }
    std::memcpy(&part, message.bytes.data(), message.bytes.size());
    answer.kind = static_cast<proto::MessageKind>(part.header.kind);
    answer.text.append(part.text, std::min<std::size_t>(part.length, sizeof part.text));
    // A long answer may come in parts, every part but the last marked so in its status.
    if (part.status == kTextContinues) continue;
    answer.status = part.status;
    return answer;
  }
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

proto::ServerAdmit admission_of(const proto::ClientHello& hello) {
  proto::ServerAdmit admit{};
  admit.header = proto::make_header(proto::MessageKind::kServerAdmit, sizeof admit);
  admit.peer_pid = hello.pid;
  admit.peer_uid = 1000;
  admit.peer_gid = 1000;
  admit.hello = hello;
  return admit;
}

TestClient::TestClient(Harness& harness, const proto::ClientHello& hello)
    : TestClient(harness, admission_of(hello)) {}

TestClient::TestClient(Harness& harness, const proto::ServerAdmit& admit) : harness_(harness) {
  proto::UniqueFd server_end;
  if (!proto::seqpacket_pair(socket_, server_end)) throw std::runtime_error("socketpair");
  if (harness.threaded()) {
    // As the daemon does: the admission and the client's socket on the control socket.
    const int fds[1] = {server_end.get()};
    if (harness.send_to_server(std::as_bytes(std::span(&admit, 1)), fds) != 0) return;
    server_end.reset();
    pollfd readable{socket_.get(), POLLIN, 0};
    if (::poll(&readable, 1, static_cast<int>(harness.threaded_timeout.count())) != 1) return;
  } else {
    harness.server->admit(admit, std::move(server_end));
  }

  proto::Received message;
  if (proto::receive_message(socket_.get(), message) != 0 || message.bytes.size() < 16) return;
  proto::HelloHeader header{};
  std::memcpy(&header, message.bytes.data(), sizeof header);
  if (header.kind != static_cast<std::uint32_t>(proto::MessageKind::kSessionWelcome) ||
      message.fds.size() < 2) {  // a third, the watch page, goes unused
    return;
  }
  std::memcpy(&welcome_, message.bytes.data(), sizeof welcome_);
  doorbell_ = std::move(message.fds[1]);
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
  // As the shim does: a worker that parked waits for the doorbell (inline passes never park).
  if (ring_.commit() && doorbell_) {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(doorbell_.get(), &one, sizeof one);
  }
}

bool TestClient::slot_ready(std::uint32_t slot) const {
  return view_.slot(slot)->state.load(std::memory_order_acquire) == proto::kSlotReady;
}

std::optional<Reply> TestClient::reply(std::uint32_t slot) {
  if (harness_.threaded()) {
    // As the shim waits: sleeps on the slot's futex, the server wakes it when it answers. A
    // session that holds a fault answers only what it was owed when the fault came (and wakes
    // every waiter then).
    proto::ResponseSlot* s = view_.slot(slot);
    auto deadline = std::chrono::steady_clock::now() + harness_.threaded_timeout;
    while (!slot_ready(slot)) {
      if (control()->fault.load(std::memory_order_acquire) != 0 ||
          std::chrono::steady_clock::now() > deadline) {
        s->waiter.store(0, std::memory_order_relaxed);
        return std::nullopt;
      }
      s->waiter.store(1, std::memory_order_seq_cst);
      if (slot_ready(slot)) break;
      proto::futex_wait(&s->state, proto::kSlotPending, 10'000'000);
    }
    s->waiter.store(0, std::memory_order_relaxed);
  } else if (!harness_.pump_until([&] { return slot_ready(slot); })) {
    return std::nullopt;
  }
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

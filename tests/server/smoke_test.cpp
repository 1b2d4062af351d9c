// The real mpsshim-server process on the host-memory test driver, driven the way the daemon and
// a client drive it: ServerReady on the control socket, a ServerAdmit with a client socket, the
// SessionWelcome with the segment and doorbell, then records through the ring.
#include <cuda.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.hpp"
#include "proto/ops.hpp"
#include "proto/unix_socket.hpp"

extern char** environ;

namespace mpsshim::server::test {
namespace {

using namespace std::chrono_literals;
constexpr int kChildControlFd = 3;
constexpr int kTestDriverMemoryMb = 256;

// The driver the server loads: the test driver, or (MPSSHIM_SMOKE_DRIVER) a real libcuda when
// this test runs on a GPU machine. A real driver needs a real image (MPSSHIM_SMOKE_IMAGE, a fat
// binary with the examples' kernels); the test driver runs kernels by name whatever it loads.
bool on_test_driver() {
  return std::getenv("MPSSHIM_SMOKE_DRIVER") == nullptr;
}

std::string driver_path() {
  const char* real = std::getenv("MPSSHIM_SMOKE_DRIVER");
  if (real != nullptr) return real;
  const char* test = std::getenv("MPSSHIM_TESTDRIVER_LIB");
  if (test == nullptr) FAIL("MPSSHIM_TESTDRIVER_LIB is not set (run through meson test)");
  return test;
}

std::vector<std::byte> module_image() {
  const char* path = std::getenv("MPSSHIM_SMOKE_IMAGE");
  if (path == nullptr) {
    std::string text = "// smoke test module: the test driver runs kernels by name\n";
    std::vector<std::byte> bytes(text.size() + 1);
    std::memcpy(bytes.data(), text.c_str(), text.size() + 1);
    return bytes;
  }
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

std::string env_or_fail(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) FAIL(name << " is not set (run through meson test)");
  return value;
}

class ServerProcess {
 public:
  explicit ServerProcess(const std::string& driver) {
    proto::UniqueFd child_end;
    REQUIRE(proto::seqpacket_pair(control, child_end));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end.get(), kChildControlFd);
    std::string exe = env_or_fail("MPSSHIM_SERVER_EXE");
    std::vector<std::string> args = {
        exe,        "--device", "0",           "--control-fd", std::to_string(kChildControlFd),
        "--driver", driver,     "--log-level", "debug"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = {
        "MPSSHIM_TESTDRIVER_DEVICES=1",
        "MPSSHIM_TESTDRIVER_MEMORY_MB=" + std::to_string(kTestDriverMemoryMb)};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "MPSSHIM_TESTDRIVER_", 19) != 0) env_strings.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
  }

  ~ServerProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  // The exit code, or -1 if it did not exit within the timeout.
  int wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

  proto::UniqueFd control;
  pid_t pid = -1;
};

bool receive_within(int fd, proto::Received& message, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  return proto::receive_message(fd, message) == 0 && !message.bytes.empty();
}

template <typename T>
T as(const proto::Received& message) {
  T value{};
  std::memcpy(&value, message.bytes.data(), std::min(sizeof value, message.bytes.size()));
  return value;
}

class Client {
 public:
  Client(ServerProcess& server, int pid) {
    proto::UniqueFd server_end;
    REQUIRE(proto::seqpacket_pair(socket, server_end));
    proto::ServerAdmit admit{};
    admit.header = proto::make_header(proto::MessageKind::kServerAdmit, sizeof admit);
    admit.peer_pid = pid;
    admit.peer_uid = ::getuid();
    admit.peer_gid = ::getgid();
    admit.hello.header = proto::make_header(proto::MessageKind::kClientAttach, sizeof admit.hello);
    admit.hello.pid = pid;
    admit.hello.active_thread_percentage = 25;
    admit.hello.priority = proto::kUnset;
    std::strcpy(admit.hello.program, "smoke_test");
    const int fds[1] = {server_end.get()};
    REQUIRE(proto::send_struct(server.control.get(), admit, fds) == 0);

    proto::Received message;
    REQUIRE(receive_within(socket.get(), message, 5000ms));
    REQUIRE(message.bytes.size() == sizeof welcome);
    welcome = as<proto::SessionWelcome>(message);
    REQUIRE(welcome.header.kind == static_cast<std::uint32_t>(proto::MessageKind::kSessionWelcome));
    REQUIRE(message.fds.size() >= 2);  // the third: the watch page
    doorbell = std::move(message.fds[1]);
    base = ::mmap(nullptr, welcome.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                  message.fds[0].get(), 0);
    REQUIRE(base != MAP_FAILED);
    proto::SegmentHeader geometry;
    std::memcpy(&geometry, base, sizeof geometry);
    REQUIRE(proto::segment_header_valid(geometry, welcome.segment_bytes));
    view = proto::SegmentView{static_cast<std::byte*>(base), geometry};
    ring = proto::RingProducer(view.ring(), geometry.ring_capacity);
  }
  ~Client() {
    if (base != nullptr && base != MAP_FAILED) ::munmap(base, welcome.segment_bytes);
  }

  template <typename Req>
  void send(proto::Op op, const Req& req, std::uint32_t slot) {
    send_bytes(op, &req, sizeof req, slot);
  }
  void send_bytes(proto::Op op, const void* payload, std::size_t bytes, std::uint32_t slot) {
    const std::uint32_t size = proto::record_bytes(bytes);
    std::byte* at = ring.try_reserve(size);
    REQUIRE(at != nullptr);
    proto::RecordHeader header{size, static_cast<std::uint16_t>(op), 0, slot, 0};
    std::memcpy(at, &header, sizeof header);
    if (bytes != 0) std::memcpy(at + sizeof header, payload, bytes);
    if (slot != proto::kNoReply) view.slot(slot)->state.store(proto::kSlotPending);
    // The server may be parked in epoll: ring its doorbell when it says it sleeps.
    if (ring.commit()) {
      std::uint64_t one = 1;
      REQUIRE(::write(doorbell.get(), &one, sizeof one) == sizeof one);
    }
  }

  // Waits for the answer in slot, as the shim would (spinning, then sleeping on the futex).
  CUresult wait(std::uint32_t slot, void* reply = nullptr, std::size_t reply_bytes = 0) {
    proto::ResponseSlot* s = view.slot(slot);
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (s->state.load(std::memory_order_acquire) != proto::kSlotReady) {
      if (std::chrono::steady_clock::now() > deadline) return CUDA_ERROR_TIMEOUT;
      s->waiter.store(1, std::memory_order_seq_cst);
      if (s->state.load(std::memory_order_seq_cst) != proto::kSlotReady) {
        proto::futex_wait(&s->state, proto::kSlotPending, 10'000'000);
      }
      s->waiter.store(0, std::memory_order_relaxed);
    }
    if (reply != nullptr) std::memcpy(reply, s->payload, reply_bytes);
    s->state.store(proto::kSlotIdle);
    return static_cast<CUresult>(s->result);
  }

  std::uint64_t load_module(std::uint64_t ctx, std::uint32_t token, std::uint32_t slot) {
    send_image(token, module_image());
    send(proto::Op::kImageLoad,
         proto::ImageLoadReq{ctx, image_bytes, token, proto::ImageKind::kModule, 0, 0}, slot);
    proto::ImageLoadRep module{};
    REQUIRE(wait(slot, &module, sizeof module) == CUDA_SUCCESS);
    return module.handle;
  }

  proto::FunctionRep get_function(std::uint64_t module, const std::string& name,
                                  std::uint32_t slot) {
    std::vector<std::byte> lookup(sizeof(proto::NamedLookupReq) + name.size());
    proto::NamedLookupReq named{module, static_cast<std::uint32_t>(name.size()), 0};
    std::memcpy(lookup.data(), &named, sizeof named);
    std::memcpy(lookup.data() + sizeof named, name.data(), name.size());
    send_bytes(proto::Op::kModuleGetFunction, lookup.data(), lookup.size(), slot);
    proto::FunctionRep function{};
    REQUIRE(wait(slot, &function, sizeof function) == CUDA_SUCCESS);
    return function;
  }

  // A one-block launch; args are already packed at the function's parameter offsets.
  void launch(const proto::FunctionRep& function, std::uint64_t stream, unsigned threads,
              std::span<const std::byte> args) {
    std::vector<std::byte> record(sizeof(proto::LaunchReq) + args.size());
    proto::LaunchReq req{};
    req.function = function.function;
    req.stream = stream;
    req.grid[0] = req.grid[1] = req.grid[2] = 1;
    req.block[0] = threads;
    req.block[1] = req.block[2] = 1;
    req.args_bytes = static_cast<std::uint32_t>(args.size());
    std::memcpy(record.data(), &req, sizeof req);
    if (!args.empty()) std::memcpy(record.data() + sizeof req, args.data(), args.size());
    send_bytes(proto::Op::kLaunchKernel, record.data(), record.size(), proto::kNoReply);
  }

  // Sends an image in a memfd under `token`.
  void send_image(std::uint32_t token, const std::vector<std::byte>& image) {
    proto::UniqueFd fd(::memfd_create("smoke-image", MFD_CLOEXEC));
    REQUIRE(fd);
    image_bytes = image.size();
    REQUIRE(::write(fd.get(), image.data(), image_bytes) == static_cast<ssize_t>(image_bytes));
    proto::FdTransfer transfer{};
    transfer.header = proto::make_header(proto::MessageKind::kModuleImage, sizeof transfer);
    transfer.token = token;
    transfer.bytes = image_bytes;
    const int fds[1] = {fd.get()};
    REQUIRE(proto::send_struct(socket.get(), transfer, fds) == 0);
  }

  proto::UniqueFd socket;
  proto::UniqueFd doorbell;
  std::uint64_t image_bytes = 0;
  proto::SessionWelcome welcome{};
  void* base = nullptr;
  proto::SegmentView view{};
  proto::RingProducer ring;
};

std::string server_stats(ServerProcess& server) {
  proto::TextMessage query{};
  query.header = proto::make_header(proto::MessageKind::kServerStatsQuery, sizeof query);
  REQUIRE(proto::send_struct(server.control.get(), query) == 0);
  proto::Received message;
  REQUIRE(receive_within(server.control.get(), message, 5000ms));
  auto reply = as<proto::TextMessage>(message);
  REQUIRE(reply.header.kind == static_cast<std::uint32_t>(proto::MessageKind::kServerStats));
  return std::string(reply.text, reply.length);
}

TEST_CASE("mpsshim-server serves a client end to end on the test driver", "[server][smoke]") {
  ServerProcess server(driver_path());

  proto::Received message;
  REQUIRE(receive_within(server.control.get(), message, 10000ms));
  REQUIRE(message.bytes.size() == sizeof(proto::ServerReady));
  auto ready = as<proto::ServerReady>(message);
  INFO(ready.message);
  REQUIRE(ready.status == 0);
  CHECK(ready.pid == server.pid);
  CHECK(ready.ordinal == 0);
  CHECK(ready.device_count >= 1);
  CHECK(std::strlen(ready.snapshot.name) > 0);
  CHECK(ready.snapshot.sm_count > 0);
  if (on_test_driver()) {
    CHECK(ready.snapshot.total_memory == std::uint64_t{kTestDriverMemoryMb} << 20);
  }
  CHECK(ready.snapshot.attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] ==
        static_cast<int>(ready.snapshot.sm_count));
  CHECK(ready.snapshot.driver_version >= 13000);

  {
    Client client(server, 4242);
    CHECK(client.welcome.sm_count > 0);
    CHECK(client.welcome.sm_count < ready.snapshot.sm_count);  // 25%

    client.send_bytes(proto::Op::kPing, nullptr, 0, 0);
    CHECK(client.wait(0) == CUDA_SUCCESS);

    client.send(proto::Op::kCtxCreate, proto::CtxCreateReq{0, 0}, 1);
    proto::CtxCreateRep ctx{};
    REQUIRE(client.wait(1, &ctx, sizeof ctx) == CUDA_SUCCESS);
    CHECK(ctx.ctx != 0);

    constexpr std::uint64_t kBytes = 1 << 20;
    client.send(proto::Op::kMemAlloc, proto::MemAllocReq{ctx.ctx, kBytes}, 2);
    proto::MemAllocRep alloc{};
    REQUIRE(client.wait(2, &alloc, sizeof alloc) == CUDA_SUCCESS);
    CHECK(alloc.dptr != 0);

    // Bytes through the GPU: staging chunk 0 -> device -> memset part -> staging chunk 1.
    std::memset(client.view.chunk(0), 0x11, 4096);
    client.send(proto::Op::kCopyHtoD,
                proto::CopyHostReq{ctx.default_stream, alloc.dptr, 4096,
                                   proto::HostRef{0, 0, proto::HostKind::kStagingChunk, 1}},
                proto::kNoReply);
    client.send(proto::Op::kMemset,
                proto::MemsetReq{ctx.default_stream, alloc.dptr + 1024, 0, 1024, 1, 0x22, 1},
                proto::kNoReply);
    client.send(proto::Op::kCopyDtoH,
                proto::CopyHostReq{ctx.default_stream, alloc.dptr, 4096,
                                   proto::HostRef{1, 0, proto::HostKind::kStagingChunk, 1}},
                proto::kNoReply);
    client.send(proto::Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 3);
    CHECK(client.wait(3) == CUDA_SUCCESS);
    CHECK(client.view.chunk_state(1)->done_generation.load() == 1);
    CHECK(client.view.chunk(1)[0] == std::byte{0x11});
    CHECK(client.view.chunk(1)[1024] == std::byte{0x22});
    CHECK(client.view.chunk(1)[2047] == std::byte{0x22});
    CHECK(client.view.chunk(1)[2048] == std::byte{0x11});
    CHECK(client.view.control()->async_error.load() == 0);

    // A kernel: image through a memfd, function and its layout, launch, result back.
    constexpr int kN = 256;
    std::uint64_t module = client.load_module(ctx.ctx, 7, 4);
    proto::FunctionRep function = client.get_function(module, "vector_add", 5);
    REQUIRE(function.param_count == 4);
    auto* a = reinterpret_cast<float*>(client.view.chunk(2));
    for (int i = 0; i < kN; ++i) a[i] = static_cast<float>(i);
    const std::uint64_t b_dptr = alloc.dptr + 4096, c_dptr = alloc.dptr + 8192;
    for (std::uint64_t dst : {alloc.dptr, b_dptr}) {
      client.send(proto::Op::kCopyHtoD,
                  proto::CopyHostReq{ctx.default_stream, dst, kN * sizeof(float),
                                     proto::HostRef{2, 0, proto::HostKind::kStagingChunk, 1}},
                  proto::kNoReply);
    }
    std::vector<std::byte> args(function.args_bytes);
    const std::uint64_t pointers[3] = {alloc.dptr, b_dptr, c_dptr};
    for (int i = 0; i < 3; ++i) std::memcpy(&args[function.params[i].offset], &pointers[i], 8);
    const int n = kN;
    std::memcpy(&args[function.params[3].offset], &n, sizeof n);
    client.launch(function, ctx.default_stream, kN, args);
    client.send(proto::Op::kCopyDtoH,
                proto::CopyHostReq{ctx.default_stream, c_dptr, kN * sizeof(float),
                                   proto::HostRef{3, 0, proto::HostKind::kStagingChunk, 1}},
                proto::kNoReply);
    client.send(proto::Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 6);
    REQUIRE(client.wait(6) == CUDA_SUCCESS);
    CHECK(client.view.control()->async_error.load() == 0);
    const auto* c = reinterpret_cast<const float*>(client.view.chunk(3));
    CHECK(c[1] == 2.0f);
    CHECK(c[kN - 1] == 2.0f * (kN - 1));

    std::string stats = server_stats(server);
    CHECK(stats.find("pid=4242") != std::string::npos);
    CHECK(stats.find("mem_used=1048576") != std::string::npos);
    CHECK(stats.find("launches=1") != std::string::npos);
  }  // the client hangs up

  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = server_stats(server).empty();
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  CHECK(gone);

  server.control.reset();  // the daemon goes away: the server finishes
  CHECK(server.wait_exit(5000ms) == 0);
}

TEST_CASE("a GPU fault reaches every client and the server exits 70", "[server][smoke]") {
  ServerProcess server(driver_path());
  proto::Received message;
  REQUIRE(receive_within(server.control.get(), message, 10000ms));
  REQUIRE(as<proto::ServerReady>(message).status == 0);
  Client culprit(server, 1001);
  Client bystander(server, 1002);
  // One answered call: the bystander's session is on its worker before the fault (a session
  // admitted after it would only see its server go away).
  bystander.send(proto::Op::kCtxCreate, proto::CtxCreateReq{0, 0}, 0);
  proto::CtxCreateRep bystander_ctx{};
  REQUIRE(bystander.wait(0, &bystander_ctx, sizeof bystander_ctx) == CUDA_SUCCESS);
  culprit.send(proto::Op::kCtxCreate, proto::CtxCreateReq{0, 0}, 0);
  proto::CtxCreateRep ctx{};
  REQUIRE(culprit.wait(0, &ctx, sizeof ctx) == CUDA_SUCCESS);
  std::uint64_t module = culprit.load_module(ctx.ctx, 1, 1);
  proto::FunctionRep fault = culprit.get_function(module, "trigger_fault", 2);
  std::vector<std::byte> args(fault.args_bytes);

  culprit.launch(fault, ctx.default_stream, 1, args);
  culprit.send(proto::Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 3);

  CHECK(culprit.wait(3) == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(culprit.view.control()->fault.load() == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(bystander.view.control()->fault.load() == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(server.wait_exit(5000ms) == 70);
}

TEST_CASE("mpsshim-server reports a driver it cannot load and exits 1", "[server][smoke]") {
  ServerProcess server("/nonexistent/libcuda.so.1");

  proto::Received message;
  REQUIRE(receive_within(server.control.get(), message, 10000ms));
  auto ready = as<proto::ServerReady>(message);
  CHECK(ready.status == CUDA_ERROR_SHARED_OBJECT_INIT_FAILED);
  CHECK(std::string(ready.message).find("/nonexistent/libcuda.so.1") != std::string::npos);
  CHECK(server.wait_exit(5000ms) == 1);
}

}  // namespace
}  // namespace mpsshim::server::test

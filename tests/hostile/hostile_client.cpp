// A hostile mpsshim client: `hostile_client RUNTIME_DIR SCENARIO [ARGS...]` runs one attack on
// the daemon of RUNTIME_DIR through the real sockets and shared memory (wire_client.hpp), and
// prints `PASS SCENARIO ...` when what it saw is what a well-defended server answers (a
// refusal, or its session ended), else `FAIL SCENARIO: ...` (exit 1). What the server logged,
// and that the other clients never noticed, is checked by tests/hostile/hostile_test.cpp.
//
// `victim` is the well-behaved target of the forgery scenarios: it prints the ids and pointer
// of its objects, waits for stdin to close, then checks every byte of its memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/hostile/wire_client.hpp"

using namespace mpsshim;
using namespace mpsshim::hostile;
using proto::Op;

namespace {

std::string g_socket;
std::vector<std::string> g_args;

int pass(const std::string& scenario, const std::string& detail = "") {
  std::printf("PASS %s %s\n", scenario.c_str(), detail.c_str());
  return 0;
}

int fail(const std::string& scenario, const std::string& why) {
  std::printf("FAIL %s: %s\n", scenario.c_str(), why.c_str());
  return 1;
}

std::uint64_t arg(std::size_t i) {
  return i < g_args.size() ? std::strtoull(g_args[i].c_str(), nullptr, 0) : 0;
}

template <typename T>
std::span<const std::byte> bytes_of(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}

// ---- hellos: the daemon must refuse or close, never welcome -------------------------------

int refused_hello(const std::string& name, std::span<const std::byte> bytes,
                  std::span<const int> fds = {}) {
  HelloAnswer answer = send_first_message(g_socket, bytes, fds);
  if (answer.welcomed) return fail(name, "the daemon opened a session");
  std::printf("RESULT kind=%u error=%d message=%s\n", answer.kind, answer.cuda_error,
              answer.message.c_str());
  return pass(name);
}

int hello_scenario(const std::string& name) {
  proto::ClientHello hello = attach_hello("hostile");
  if (name == "bad-magic") {
    hello.header.magic = 0xdeadbeef;
    return refused_hello(name, bytes_of(hello));
  }
  if (name == "wrong-abi") {
    hello.header.abi_major = 99;
    return refused_hello(name, bytes_of(hello));
  }
  if (name == "truncated-hello") {
    return refused_hello(name, bytes_of(hello).first(100));
  }
  if (name == "oversized-hello") {
    std::vector<std::byte> big(64 * 1024);
    hello.header.size = static_cast<std::uint32_t>(big.size());
    std::memcpy(big.data(), &hello, sizeof hello);
    return refused_hello(name, big);
  }
  if (name == "hello-size-lies") {
    hello.header.size = 200;
    return refused_hello(name, bytes_of(hello));
  }
  if (name == "hello-with-fds") {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return fail(name, "pipe");
    int rc = refused_hello(name, bytes_of(hello), std::span<const int>(pipe_fds, 2));
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return rc;
  }
  return -1;
}

// ---- records and socket messages that break the protocol: the session must end ------------

int expect_end(const std::string& name, WireClient& client) {
  auto fault = client.wait_for_end();
  if (!fault) return fail(name, "the session did not end");
  return pass(name, "fault=" + std::to_string(*fault));
}

int protocol_scenario(const std::string& name) {
  WireClient client(g_socket);
  client.create_context();
  const std::array<std::byte, 16> sixteen{};
  if (name == "unknown-opcode") {
    client.post(4000, sixteen, 0);
  } else if (name == "truncated-record") {
    client.post(static_cast<std::uint16_t>(Op::kMemAlloc), {}, 0);  // MemAlloc without its request
  } else if (name == "oversized-record") {
    std::vector<std::byte> big(128 * 1024);
    client.post(static_cast<std::uint16_t>(Op::kPing), big, 0);
  } else if (name == "record-size-lies") {
    // A size that is no multiple of the record alignment.
    client.post(static_cast<std::uint16_t>(Op::kPing), {}, 0, 24);
  } else if (name == "record-past-head") {
    // A size that runs past what the writer published.
    client.post(static_cast<std::uint16_t>(Op::kPing), {}, 0, 4096);
  } else if (name == "head-backwards") {
    const std::uint64_t tail = client.ring().tail.load();
    client.ring().head.store(tail - proto::kRecordAlign, std::memory_order_release);
    client.ring_doorbell();
  } else if (name == "head-past-writer") {
    const std::uint64_t tail = client.ring().tail.load();
    client.ring().head.store(tail + 4 * client.view().geometry.ring_capacity,
                             std::memory_order_release);
    client.ring_doorbell();
  } else if (name == "reply-slot-out-of-range") {
    client.post(static_cast<std::uint16_t>(Op::kPing), {}, 1u << 20);
  } else if (name == "socket-garbage") {
    std::array<std::byte, 100> garbage{};
    proto::send_message(client.socket(), garbage);
  } else if (name == "fd-transfer-without-fd") {
    proto::FdTransfer t{proto::make_header(proto::MessageKind::kHostMemory, sizeof t), 1, 0, 4096};
    proto::send_struct(client.socket(), t);
  } else if (name == "fd-transfer-three-fds") {
    proto::FdTransfer t{proto::make_header(proto::MessageKind::kHostMemory, sizeof t), 1, 0, 4096};
    int fds[3] = {::memfd_create("a", MFD_CLOEXEC), ::memfd_create("b", MFD_CLOEXEC),
                  ::memfd_create("c", MFD_CLOEXEC)};
    proto::send_struct(client.socket(), t, std::span<const int>(fds, 3));
    for (int fd : fds) ::close(fd);
  } else {
    return -1;
  }
  return expect_end(name, client);
}

// Hangs up, then goes on writing records and ringing the doorbell: nothing more may run.
int write_after_hangup(const std::string& name) {
  WireClient client(g_socket);
  client.create_context();
  ::shutdown(client.socket(), SHUT_RDWR);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server sees the hang-up
  const std::uint64_t executed = client.records_executed();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  int posted = 0;
  while (std::chrono::steady_clock::now() < until) {
    proto::MemAllocReq req{client.ctx(), 4096};
    if (!client.post(static_cast<std::uint16_t>(Op::kMemAlloc), bytes_of(req), proto::kNoReply, 0,
                     std::chrono::milliseconds(10))) {
      break;
    }
    ++posted;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (client.records_executed() != executed) {
    return fail(name, "the server ran records written after the hang-up");
  }
  return pass(name, "posted=" + std::to_string(posted));
}

// ---- floods: refused at the client's cap with CUDA_ERROR_OUT_OF_MEMORY ---------------------

// Calls `make` until it fails; passes when the failure is OUT_OF_MEMORY after `expected` (the
// cap less what the client held before) successes.
int flood(const std::string& name, std::uint64_t expected, const std::function<CUresult()>& make) {
  std::uint64_t made = 0;
  CUresult r = CUDA_SUCCESS;
  while ((r = make()) == CUDA_SUCCESS && made < 10 * expected + 1000) ++made;
  std::printf("RESULT made=%llu then error=%d\n", static_cast<unsigned long long>(made), r);
  if (r != CUDA_ERROR_OUT_OF_MEMORY) return fail(name, "not refused with OUT_OF_MEMORY");
  if (made != expected) return fail(name, "refused after " + std::to_string(made));
  return pass(name, "made=" + std::to_string(made));
}

int memfd_of(std::uint64_t bytes, std::string_view content = {}) {
  int fd = ::memfd_create("hostile", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return -1;
  if (!content.empty() && ::pwrite(fd, content.data(), content.size(), 0) < 0) return -1;
  return fd;
}

int flood_scenario(const std::string& name) {
  const std::uint64_t cap = arg(0);
  WireClient client(g_socket);
  client.create_context();
  if (name == "flood-streams") {  // the context's default stream counts
    return flood(name, cap - 1, [&] {
      return client.call(Op::kStreamCreate, proto::StreamCreateReq{client.ctx(), 1, 0}).result;
    });
  }
  if (name == "flood-events") {
    return flood(name, cap, [&] {
      return client.call(Op::kEventCreate, proto::EventCreateReq{client.ctx(), 0, 0}).result;
    });
  }
  if (name == "flood-modules") {
    static constexpr std::string_view kPtx = ".version 8.0\n.target sm_90\n";
    std::uint32_t token = 0;
    return flood(name, cap, [&] {
      int fd = memfd_of(kPtx.size() + 1, kPtx);
      ++token;
      client.send_fd(proto::MessageKind::kModuleImage, token, fd, kPtx.size() + 1);
      ::close(fd);
      proto::ImageLoadReq req{
          client.ctx(), kPtx.size() + 1, token, proto::ImageKind::kModule, 0, 0};
      return client.call(Op::kImageLoad, req).result;
    });
  }
  if (name == "flood-graphs") {
    return flood(name, cap, [&] {
      return client.call(Op::kGraphCreate, proto::GraphCreateReq{client.ctx(), 0, 0}).result;
    });
  }
  if (name == "flood-memory-pools") {
    return flood(name, cap, [&] {
      return client.call(Op::kMemPoolCreate, proto::MemPoolCreateReq{0, 0, 0}).result;
    });
  }
  if (name == "flood-allocations") {
    return flood(name, cap, [&] {
      return client.call(Op::kMemAlloc, proto::MemAllocReq{client.ctx(), 256}).result;
    });
  }
  if (name == "flood-pinned") {  // cap in bytes, 1 MiB a region
    constexpr std::uint64_t kRegion = 1 << 20;
    std::uint32_t token = 0;
    return flood(name, cap / kRegion, [&] {
      int fd = memfd_of(kRegion);
      ++token;
      client.send_fd(proto::MessageKind::kHostMemory, token, fd, kRegion);
      ::close(fd);
      return client.call(Op::kHostRegister, proto::HostRegisterReq{0, kRegion, token, 0}).result;
    });
  }
  if (name == "flood-host-functions") {
    // Host functions the client never runs: the first holds its stream, the rest wait behind it.
    auto stream = client.call(Op::kStreamCreate, proto::StreamCreateReq{client.ctx(), 1, 0});
    const std::uint64_t s = stream.as<proto::StreamCreateRep>().stream;
    std::uint64_t id = 0;
    return flood(name, cap, [&] {
      proto::HostFuncReq req{s, ++id, proto::HostFuncKind::kLaunchHostFunc, 0};
      client.one_way(Op::kHostFunc, req);
      // One-way: its error arrives as the asynchronous error, by the next call's time.
      if (client.call(Op::kPing, std::array<std::byte, 0>{}).result != CUDA_SUCCESS) {
        return CUDA_ERROR_UNKNOWN;
      }
      return static_cast<CUresult>(client.view().control()->async_error.exchange(0));
    });
  }
  if (name == "flood-in-flight") {
    // A host function the client never runs holds the stream; staged copies queued behind it
    // each wait for the GPU. The server must stop reading at the cap, not pile them up.
    auto stream = client.call(Op::kStreamCreate, proto::StreamCreateReq{client.ctx(), 1, 0});
    const std::uint64_t s = stream.as<proto::StreamCreateRep>().stream;
    auto memory = client.call(Op::kMemAlloc, proto::MemAllocReq{client.ctx(), 4096});
    const std::uint64_t dptr = memory.as<proto::MemAllocRep>().dptr;
    client.one_way(Op::kHostFunc,
                   proto::HostFuncReq{s, 1, proto::HostFuncKind::kLaunchHostFunc, 0});
    const std::uint64_t before = client.records_executed();
    std::uint64_t posted = 0;
    for (std::uint32_t generation = 1;; ++generation) {
      proto::CopyHostReq req{s, dptr, 64,
                             proto::HostRef{0, 0, proto::HostKind::kStagingChunk, generation}};
      if (!client.post(static_cast<std::uint16_t>(Op::kCopyHtoD), bytes_of(req), proto::kNoReply, 0,
                       std::chrono::milliseconds(500))) {
        break;  // the ring is full: the server stopped reading
      }
      ++posted;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::uint64_t ran = client.records_executed() - before;
    std::printf("RESULT posted=%llu ran=%llu\n", static_cast<unsigned long long>(posted),
                static_cast<unsigned long long>(ran));
    // The host function and `cap` copies are in flight; one more was read and stopped at.
    if (ran > cap + 1 || posted <= cap) return fail(name, "the server read past the cap");
    return pass(name, "ran=" + std::to_string(ran));
  }
  return -1;
}

// ---- another client's objects --------------------------------------------------------------

constexpr std::size_t kVictimBytes = 64 * 1024;

std::byte victim_byte(std::size_t i) {
  return static_cast<std::byte>((i * 131 + 7) & 0xff);
}

// A well-behaved client: memory with a known pattern, a stream, an event. Prints them, waits
// for stdin to close, then checks every byte.
int victim() {
  WireClient client(g_socket, "victim");
  client.create_context();
  auto memory = client.call(Op::kMemAlloc, proto::MemAllocReq{client.ctx(), kVictimBytes});
  const std::uint64_t dptr = memory.as<proto::MemAllocRep>().dptr;
  std::vector<std::byte> pattern(kVictimBytes);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = victim_byte(i);
  if (memory.result != CUDA_SUCCESS || client.copy_in(dptr, pattern) != CUDA_SUCCESS) {
    return fail("victim", "setup failed");
  }
  auto stream = client.call(Op::kStreamCreate, proto::StreamCreateReq{client.ctx(), 1, 0});
  auto event = client.call(Op::kEventCreate, proto::EventCreateReq{client.ctx(), 0, 0});
  std::printf("VICTIM dptr=%#llx stream=%#llx event=%#llx ctx=%#llx\n",
              static_cast<unsigned long long>(dptr),
              static_cast<unsigned long long>(stream.as<proto::StreamCreateRep>().stream),
              static_cast<unsigned long long>(event.as<proto::EventCreateRep>().event),
              static_cast<unsigned long long>(client.ctx()));
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  std::vector<std::byte> back(kVictimBytes);
  if (CUresult r = client.copy_out(dptr, back); r != CUDA_SUCCESS) {
    return fail("victim", "copy back failed: " + std::to_string(r));
  }
  for (std::size_t i = 0; i < back.size(); ++i) {
    if (back[i] != victim_byte(i)) {
      return fail("victim", "byte " + std::to_string(i) + " changed");
    }
  }
  return pass("victim", "bytes=" + std::to_string(kVictimBytes));
}

// Names the victim's pointer and handles (args: dptr stream event ctx): every request must be
// refused, and nothing of the victim's may come back.
int forge() {
  const std::uint64_t dptr = arg(0), stream = arg(1), event = arg(2), ctx = arg(3);
  WireClient client(g_socket, "forger");
  client.create_context();
  std::map<std::string, CUresult> results;
  // Reading its memory into our staging chunk, which we fill with zeros first.
  std::memset(client.view().chunk(0), 0, 4096);
  std::vector<std::byte> stolen(4096);
  results["CopyDtoH"] = client.copy_out(dptr, stolen);
  std::size_t same = 0;
  for (std::size_t i = 0; i < stolen.size(); ++i) same += stolen[i] == victim_byte(i) ? 1 : 0;
  const bool leaked = same > stolen.size() / 2;  // zeros match the pattern's zero bytes only
  auto mine = client.call(Op::kMemAlloc, proto::MemAllocReq{client.ctx(), 4096});
  const std::uint64_t own = mine.as<proto::MemAllocRep>().dptr;
  results["CopyDtoD"] =
      client.call(Op::kCopyDtoD, proto::CopyDtoDReq{client.default_stream(), own, dptr, 4096})
          .result;
  results["CopyHtoD"] = client.copy_in(dptr, std::vector<std::byte>(4096));
  results["Memset"] =
      client.call(Op::kMemset, proto::MemsetReq{client.default_stream(), dptr, 0, 4096, 1, 0, 1})
          .result;
  results["MemFree"] = client.call(Op::kMemFree, proto::MemFreeReq{dptr}).result;
  results["StreamSynchronize"] =
      client.call(Op::kStreamSynchronize, proto::HandleReq{stream}).result;
  results["EventRecord"] =
      client.call(Op::kEventRecord, proto::EventRecordReq{event, client.default_stream(), 0, 0})
          .result;
  results["EventSynchronize"] = client.call(Op::kEventSynchronize, proto::HandleReq{event}).result;
  results["StreamCreate(ctx)"] =
      client.call(Op::kStreamCreate, proto::StreamCreateReq{ctx, 1, 0}).result;
  results["MemAlloc(ctx)"] = client.call(Op::kMemAlloc, proto::MemAllocReq{ctx, 4096}).result;
  bool all_refused = true;
  for (const auto& [what, r] : results) {
    std::printf("RESULT %s=%d\n", what.c_str(), r);
    all_refused &= r != CUDA_SUCCESS;
  }
  if (leaked) return fail("forge", "the victim's bytes came back");
  if (!all_refused) return fail("forge", "a request naming the victim's objects succeeded");
  // The session goes on: its own objects still work.
  if (client.call(Op::kMemFree, proto::MemFreeReq{own}).result != CUDA_SUCCESS) {
    return fail("forge", "its own free failed");
  }
  return pass("forge");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: hostile_client RUNTIME_DIR SCENARIO [ARGS...]\n");
    return 2;
  }
  g_socket = std::string(argv[1]) + "/" + proto::kControlSocketName;
  const std::string scenario = argv[2];
  for (int i = 3; i < argc; ++i) g_args.emplace_back(argv[i]);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    if (scenario == "victim") return victim();
    if (scenario == "forge") return forge();
    if (scenario == "write-after-hangup") return write_after_hangup(scenario);
    if (scenario.starts_with("flood-")) return flood_scenario(scenario);
    if (scenario.find("hello") != std::string::npos || scenario == "bad-magic" ||
        scenario == "wrong-abi") {
      return hello_scenario(scenario);
    }
    if (int rc = protocol_scenario(scenario); rc >= 0) return rc;
  } catch (const std::exception& e) {
    return fail(scenario, e.what());
  }
  std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
  return 2;
}

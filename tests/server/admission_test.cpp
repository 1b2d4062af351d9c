// Admission (ServerAdmit), quotas, and the daemon's control requests.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;

proto::TextMessage ask_daemon(Harness& h, proto::MessageKind kind, const std::string& text) {
  proto::TextMessage request{};
  request.header = proto::make_header(kind, sizeof request);
  request.length = static_cast<std::uint32_t>(text.size());
  std::memcpy(request.text, text.data(), text.size());
  REQUIRE(proto::send_struct(h.daemon.get(), request) == 0);
  proto::TextMessage reply{};
  proto::Received message;
  bool answered = h.pump_until([&] {
    ::fcntl(h.daemon.get(), F_SETFL, O_NONBLOCK);
    return proto::receive_message(h.daemon.get(), message) == 0 && !message.bytes.empty();
  });
  REQUIRE(answered);
  std::memcpy(&reply, message.bytes.data(), std::min(message.bytes.size(), sizeof reply));
  return reply;
}

std::string text_of(const proto::TextMessage& m) {
  return std::string(m.text, m.length);
}

TEST_CASE("a client gets the whole device and no limit by default", "[server][admission]") {
  Harness h;
  TestClient sut(h);
  REQUIRE(sut.connected());
  CHECK(sut.welcome().sm_count == 132);
  CHECK(sut.welcome().memory_limit == 0);
  CHECK(sut.welcome().client_id == 1);
  CHECK(
      h.logged("client 1 (pid 4123, vector_add, uid 1000) connected: 132 of 132 SMs, no "
               "memory limit"));
  CHECK(fake_gpu().green_live == 1);
  CHECK(sut.call_empty(Op::kPing).result == CUDA_SUCCESS);
}

TEST_CASE("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE becomes a green context of whole groups",
          "[server][admission]") {
  Harness h;
  auto hello = default_hello();
  hello.active_thread_percentage = 25;

  SECTION("8-SM groups") {
    TestClient sut(h, hello);
    CHECK(sut.welcome().sm_count == 40);
    CHECK(fake_gpu().last_split_min_count == 40);
    CHECK(fake_gpu().last_split_flags == 0);
  }
  SECTION("2-SM groups when co-scheduling may be ignored") {
    hello.flags = proto::kHelloIgnoreSmCoscheduling;
    TestClient sut(h, hello);
    CHECK(sut.welcome().sm_count == 34);
    CHECK(fake_gpu().last_split_flags == CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING);
  }
}

TEST_CASE("a client of another ABI major is refused with both versions named",
          "[server][admission]") {
  Harness h;
  auto hello = default_hello();
  hello.header.abi_major = proto::kAbiMajor + 1;

  TestClient sut(h, hello);

  CHECK_FALSE(sut.connected());
  CHECK(h.server->session_count() == 0);
  CHECK(h.logged(fmt::format("the client speaks ABI {}.", proto::kAbiMajor + 1)));
  CHECK(h.logged(fmt::format("this server {}.{}", proto::kAbiMajor, proto::kAbiMinor)));
}

TEST_CASE("the refusal carries CUDA_ERROR_MPS_CONNECTION_FAILED", "[server][admission]") {
  Harness h;
  auto hello = default_hello();
  hello.header.magic = 0;
  proto::UniqueFd client, server_end;
  REQUIRE(proto::seqpacket_pair(client, server_end));
  proto::ServerAdmit admit{};
  admit.header = proto::make_header(proto::MessageKind::kServerAdmit, sizeof admit);
  admit.hello = hello;

  h.server->admit(admit, std::move(server_end));

  proto::Received message;
  REQUIRE(proto::receive_message(client.get(), message) == 0);
  proto::Refused refused{};
  REQUIRE(message.bytes.size() == sizeof refused);
  std::memcpy(&refused, message.bytes.data(), sizeof refused);
  CHECK(refused.cuda_error == CUDA_ERROR_MPS_CONNECTION_FAILED);
  CHECK(std::string(refused.message).find("version mismatch") != std::string::npos);
}

// Sends the daemon's admission of a client with `hello` over the control socket and returns
// the server's welcome as the client receives it.
proto::Received admit_through_control(Harness& h, const proto::ClientHello& hello) {
  proto::UniqueFd client, server_end;
  REQUIRE(proto::seqpacket_pair(client, server_end));
  proto::ServerAdmit admit{};
  admit.header = proto::make_header(proto::MessageKind::kServerAdmit, sizeof admit);
  admit.peer_pid = hello.pid;
  admit.hello = hello;
  const int fds[1] = {server_end.get()};

  REQUIRE(proto::send_struct(h.daemon.get(), admit, fds) == 0);
  server_end.reset();

  CHECK(h.pump_until([&] { return h.server->session_count() == 1; }));
  proto::Received message;
  REQUIRE(proto::receive_message(client.get(), message) == 0);
  return message;
}

TEST_CASE("the daemon admits clients through the control socket", "[server][admission]") {
  Harness h;
  const proto::Received message = admit_through_control(h, default_hello(77));
  // The segment, the doorbell and the watch page of its host fences.
  REQUIRE(message.fds.size() == 3);

  // The client reads the fence words and can never write them: a fence it could fake would
  // have the server free memory under its running work (host_fences.hpp).
  const int page = message.fds[2].get();
  void* writable = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, page, 0);
  CHECK(writable == MAP_FAILED);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(page, 8192) != 0);
  void* readable = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, page, 0);
  REQUIRE(readable != MAP_FAILED);
  CHECK(::mprotect(readable, 4096, PROT_READ | PROT_WRITE) != 0);
  ::munmap(readable, 4096);
}

TEST_CASE("a client of an ABI before fence watches gets no watch page", "[server][admission]") {
  Harness h;
  proto::ClientHello hello = default_hello(78);
  hello.header.abi_minor = proto::kAbiMinorFenceWatch - 1;
  CHECK(admit_through_control(h, hello).fds.size() == 2);
}

TEST_CASE("stats list one line per client", "[server][control]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  sut.alloc(ctx.ctx, 1 << 20);

  auto reply = ask_daemon(h, proto::MessageKind::kServerStatsQuery, "");

  CHECK(reply.header.kind == static_cast<std::uint32_t>(proto::MessageKind::kServerStats));
  const std::string line = text_of(reply);
  const std::string started = " start_time=";
  const std::size_t at = line.find(started);
  REQUIRE(at != std::string::npos);
  CHECK(line.substr(0, at) ==
        "client=1 pid=4123 uid=1000 program=vector_add sms=132 sm_percentage=100 mem_used=1048576 "
        "mem_peak=1048576 mem_limit=0 pinned=0 launches=0 busy_us=- h2d_bytes=0 d2h_bytes=0 "
        "d2d_bytes=0 priority=0 state=active");
  // start_time: unix seconds with milliseconds, now or a moment ago; then the allocation and the
  // static SM partition (none), the time held back for priorities (none), the SMs it leaves to
  // normal-priority clients (none), nothing parked and never suspended, and the worker.
  const double start_time = std::stod(line.substr(at + started.size()));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(start_time <= now);
  CHECK(start_time > now - 60);
  CHECK(line.ends_with(
      " allocation=0 partition=0 held_us=0 sms_held_back=0 parked=0 suspended_us=0 worker=0\n"));
}

TEST_CASE("terminate_client ends that client's session and tells it", "[server][control]") {
  Harness h;
  TestClient victim(h, default_hello(4123));
  TestClient bystander(h, default_hello(5555));

  auto reply = ask_daemon(h, proto::MessageKind::kServerTerminateClient, "4123");

  CHECK(reply.status == 0);
  CHECK(text_of(reply) == "terminated client 1 (pid 4123, vector_add)");
  CHECK(victim.control()->fault.load() == CUDA_ERROR_MPS_CLIENT_TERMINATED);
  CHECK(bystander.control()->fault.load() == 0);
  CHECK(h.pump_until([&] { return h.server->session_count() == 1; }));

  auto missing = ask_daemon(h, proto::MessageKind::kServerTerminateClient, "999");
  CHECK(missing.status != 0);
}

TEST_CASE("default quotas change for new clients", "[server][control]") {
  Harness h;
  TestClient before(h);

  auto sm =
      ask_daemon(h, proto::MessageKind::kCtlRequest, "set_default_active_thread_percentage 25");
  auto mem = ask_daemon(h, proto::MessageKind::kCtlRequest, "set_default_memory_limit 4096");
  auto bad =
      ask_daemon(h, proto::MessageKind::kCtlRequest, "set_default_active_thread_percentage 0");
  TestClient after(h);

  CHECK(text_of(sm) == "ok");
  CHECK(text_of(mem) == "ok");
  CHECK(bad.status != 0);
  CHECK(before.welcome().sm_count == 132);
  CHECK(after.welcome().sm_count == 40);
  CHECK(after.welcome().memory_limit == 4096);
}

TEST_CASE("the server finishes when the daemon hangs up", "[server][control]") {
  Harness h;
  TestClient sut(h);

  h.daemon.reset();

  CHECK(h.pump_until([&] { return h.server->finished(); }));
  CHECK(sut.control()->fault.load() == CUDA_ERROR_MPS_CONNECTION_FAILED);
}

}  // namespace
}  // namespace mpsshim::server::test

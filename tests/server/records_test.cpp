// Malformed records end the session that sent them — never the server, never another client.
#include <catch2/catch.hpp>

#include "proto/ops_vmm.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;

// The session is over when the client's fault says the protocol broke and the server has
// freed it.
bool session_ended(Harness& h, TestClient& client) {
  return h.pump_until([&] {
    return client.control()->fault.load() == CUDA_ERROR_MPS_RPC_FAILURE &&
           h.server->find_session(client.welcome().client_id) == nullptr;
  });
}

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

TEST_CASE("a record shorter than its request ends the session", "[server][records]") {
  Harness h;
  TestClient sut(h);
  std::vector<std::byte> short_payload(24);  // a CopyHostReq is 48 bytes

  sut.send_raw(static_cast<std::uint16_t>(Op::kCopyHtoD), short_payload, proto::kNoReply);

  CHECK(session_ended(h, sut));
  CHECK(h.logged("sent a CopyHtoD record with 32 payload bytes; it needs 48"));
  CHECK(h.fatal_code == -1);
}

TEST_CASE("a name length that does not match the record ends the session", "[server][records]") {
  Harness h;
  TestClient sut(h);
  auto name = bytes_of("kern");
  proto::NamedLookupReq req{1, 100, 0};  // says 100 bytes, sends 4

  sut.send(Op::kModuleGetFunction, req, 0, name);

  CHECK(session_ended(h, sut));
  CHECK(h.logged("names 100 bytes of name"));
}

TEST_CASE("access descriptors that do not match a cuMemSetAccess record end the session",
          "[server][records][vmm]") {
  Harness h;
  TestClient sut(h);
  proto::VmmSetAccessReq req{0x7f0000000000, 2 << 20, 3, 0};  // says 3, sends 1
  proto::VmmAccessDesc one{CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  std::vector<std::byte> trailing(sizeof one);
  std::memcpy(trailing.data(), &one, sizeof one);

  sut.send(Op::kVmmSetAccess, req, 0, trailing);

  CHECK(session_ended(h, sut));
  CHECK(h.logged("cuMemSetAccess record whose 3 access descriptors do not match its size"));
  CHECK(h.fatal_code == -1);
}

TEST_CASE("launch argument and attribute counts must match the record", "[server][records]") {
  Harness h;
  TestClient sut(h);
  proto::LaunchReq req{};
  req.args_bytes = 64;
  std::vector<std::byte> args(16);  // 48 bytes short

  sut.send(Op::kLaunchKernel, req, proto::kNoReply, args);

  CHECK(session_ended(h, sut));
}

TEST_CASE("a reply slot past the last one ends the session", "[server][records]") {
  Harness h;
  TestClient sut(h);
  const std::uint32_t slot_count = sut.view().geometry.slot_count;

  sut.send_raw(static_cast<std::uint16_t>(Op::kPing), {}, slot_count);

  CHECK(session_ended(h, sut));
  CHECK(h.logged(fmt::format("named reply slot {}", slot_count)));
}

TEST_CASE("an unknown opcode ends the session", "[server][records]") {
  Harness h;
  TestClient sut(h);
  sut.send_raw(999, {}, proto::kNoReply);
  CHECK(session_ended(h, sut));
  CHECK(h.logged("sent unknown opcode 999"));
}

TEST_CASE("a call that returns data must name a reply slot", "[server][records]") {
  Harness h;
  TestClient sut(h);
  sut.send(Op::kMemAlloc, proto::MemAllocReq{1, 4096});
  CHECK(session_ended(h, sut));
  CHECK(h.logged("sent a MemAlloc without a reply slot"));
}

TEST_CASE("reusing a slot whose answer is still owed ends the session", "[server][records]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, 4096);
  sut.send(Op::kMemset, proto::MemsetReq{ctx.default_stream, dptr, 0, 16, 1, 0, 1});
  fake_gpu().busy = true;

  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  h.pump();
  sut.send_empty(Op::kPing, 0);

  h.pump();
  CHECK(sut.control()->fault.load() == CUDA_ERROR_MPS_RPC_FAILURE);
  CHECK(sut.slot_ready(0));  // the owed answer was given, with the error
  CHECK(h.server->find_session(sut.welcome().client_id) != nullptr);  // its GPU work runs on
  fake_gpu().busy = false;
  CHECK(session_ended(h, sut));
}

TEST_CASE("a record larger than the ring published ends the session", "[server][records]") {
  Harness h;
  TestClient sut(h);
  sut.send_raw(static_cast<std::uint16_t>(Op::kPing), {}, 0, 0, 4096);  // claims 4 KiB
  CHECK(session_ended(h, sut));
  CHECK(h.logged("corrupted its request ring"));
}

TEST_CASE("one client's bad record leaves the others alone", "[server][records]") {
  Harness h;
  TestClient bad(h, default_hello(1111, "bad"));
  TestClient good(h, default_hello(2222, "good"));
  auto ctx = good.create_context();
  std::uint64_t dptr = good.alloc(ctx.ctx, 1 << 20);

  bad.send_raw(999, {}, proto::kNoReply);
  REQUIRE(session_ended(h, bad));

  CHECK(good.call_empty(Op::kPing).result == CUDA_SUCCESS);
  CHECK(good.control()->fault.load() == 0);
  CHECK(fake_gpu().allocations.count(dptr) == 1);
  CHECK(h.fatal_code == -1);
}

}  // namespace
}  // namespace mpsshim::server::test

// CUDA IPC through the server's ops on the fake driver (broker/server/ops/ipc.cpp, docs/ipc.md):
// clients admitted with the uids the daemon would have read from SO_PEERCRED, forged here.
#include <catch2/catch.hpp>

#include "proto/ops_ipc.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;
constexpr uid_t kAlice = 1000;  // admission_of's uid
constexpr uid_t kBob = 1001;

std::byte* device(std::uint64_t dptr) {
  return reinterpret_cast<std::byte*>(dptr);
}

proto::ServerAdmit admitted_as(uid_t uid, int pid) {
  proto::ServerAdmit admit = admission_of(default_hello(pid, "worker"));
  admit.peer_uid = uid;
  return admit;
}

proto::IpcHandle exported(TestClient& client, std::uint64_t dptr) {
  Reply reply = client.call(Op::kIpcGetMemHandle, proto::IpcGetMemHandleReq{dptr});
  REQUIRE(reply.result == CUDA_SUCCESS);
  return reply.as<proto::IpcHandle>();
}

Reply open(TestClient& client, const proto::IpcHandle& handle) {
  return client.call(Op::kIpcOpenMemHandle,
                     proto::IpcOpenReq{handle, 0, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, 0});
}

TEST_CASE(
    "another uid's handle is refused with a log line naming the policy; the same uid's "
    "opens at the exporter's address",
    "[server][ipc]") {
  Harness h;
  TestClient exporter(h, admitted_as(kAlice, 4001));
  TestClient bob(h, admitted_as(kBob, 4002));
  TestClient alice(h, admitted_as(kAlice, 4003));
  const std::uint64_t dptr = exporter.alloc(exporter.create_context().ctx, kMiB);
  const proto::IpcHandle handle = exported(exporter, dptr + 4096);
  CHECK(handle.offset == 4096);
  CHECK(handle.bytes == kMiB);

  CHECK(open(bob, handle).result == CUDA_ERROR_INVALID_HANDLE);
  CHECK(
      h.logged("client 2 (pid 4002, worker) (uid 1001) tried to open an IPC memory handle "
               "exported by uid 1000: only clients of the same user may open each other's "
               "handles (policy: docs/ipc.md); refused"));
  // Bob's session goes on.
  CHECK(bob.call_empty(Op::kPing).result == CUDA_SUCCESS);

  Reply opened = open(alice, handle);
  REQUIRE(opened.result == CUDA_SUCCESS);
  CHECK(opened.as<proto::IpcOpenMemRep>().base == dptr);
  CHECK(opened.as<proto::IpcOpenMemRep>().bytes == kMiB);
  // Opened memory is alice's to copy to, but not to free.
  CHECK(alice.call(Op::kMemFree, proto::MemFreeReq{dptr}).result == CUDA_ERROR_INVALID_VALUE);
  Reply closed = alice.call(Op::kIpcCloseMemHandle, proto::MemFreeReq{dptr});
  CHECK(closed.result == CUDA_SUCCESS);
  CHECK(closed.as<proto::IpcCloseRep>().still_open == 0);
  CHECK(alice.call(Op::kIpcCloseMemHandle, proto::MemFreeReq{dptr}).result ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_gpu().allocations.count(dptr) == 1);  // still the exporter's
}

TEST_CASE("the ipc-opens cap refuses one open more with a log line naming it", "[server][ipc]") {
  ServerSettings settings;
  settings.client_limits.set(ClientLimit::kIpcOpens, 1);
  Harness h(settings);
  TestClient exporter(h, admitted_as(kAlice, 4001));
  TestClient importer(h, admitted_as(kAlice, 4002));
  const auto ctx = exporter.create_context().ctx;
  const proto::IpcHandle first = exported(exporter, exporter.alloc(ctx, kMiB));
  const proto::IpcHandle second = exported(exporter, exporter.alloc(ctx, kMiB));

  CHECK(open(importer, first).result == CUDA_SUCCESS);
  CHECK(open(importer, first).result == CUDA_SUCCESS);  // the same allocation again: no more
  CHECK(open(importer, second).result == CUDA_ERROR_TOO_MANY_PEERS);
  CHECK(
      h.logged("per-client limit `ipc-opens`; raise it with mpsshimd --client-limit "
               "ipc-opens=N"));
}

TEST_CASE("an allocation its exporter freed lives until its importer ends; then it is freed",
          "[server][ipc]") {
  Harness h;
  TestClient exporter(h, admitted_as(kAlice, 4001));
  auto importer = std::make_unique<TestClient>(h, admitted_as(kAlice, 4002));
  const auto importer_ctx = importer->create_context();
  const std::uint64_t dptr = exporter.alloc(exporter.create_context().ctx, kMiB);
  REQUIRE(open(*importer, exported(exporter, dptr)).result == CUDA_SUCCESS);

  CHECK(exporter.call(Op::kMemFree, proto::MemFreeReq{dptr}).result == CUDA_SUCCESS);
  h.pump();
  CHECK(fake_gpu().allocations.count(dptr) == 1);
  CHECK(h.logged("while other clients have it open"));
  // A copy into it still passes the importer's ownership check.
  CHECK(importer
            ->call(Op::kMemset,
                   proto::MemsetReq{importer_ctx.default_stream, dptr, 0, 64, 1, 0x5a5a5a5a, 4})
            .result == CUDA_SUCCESS);
  CHECK(device(dptr)[255] == std::byte{0x5a});

  importer->hang_up();  // ends without closing
  CHECK(h.pump_until([&] { return fake_gpu().allocations.count(dptr) == 0; }));
  CHECK(h.server->ipc_registry().memory_entries() == 0);
}

}  // namespace
}  // namespace mpsshim::server::test

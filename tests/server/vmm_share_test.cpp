// VMM physical allocations shared between clients by fd, under the cuIpc policy
// (broker/server/ops/vmm_share.cpp, docs/ipc.md "VMM shareable handles"): what an export hands
// out is a sealed memfd naming a registry entry; another user's import is refused; the memory
// stays charged to its exporter while an import holds it.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "proto/ops_vmm.hpp"
#include "proto/ops_vmm_share.hpp"
#include "tests/server/fake_driver.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;
constexpr uid_t kAlice = 1000;
constexpr uid_t kBob = 1001;

proto::ServerAdmit admitted_as(uid_t uid, int pid, std::uint64_t limit = 0) {
  proto::ClientHello hello = default_hello(pid, "rank");
  hello.device_memory_limit = limit;
  proto::ServerAdmit admit = admission_of(hello);
  admit.peer_uid = uid;
  return admit;
}

proto::WireHandle create_exportable(TestClient& client, std::uint64_t bytes) {
  proto::VmmProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  Reply r = client.call(Op::kVmmCreate, proto::VmmCreateReq{prop, 0, bytes, 0});
  REQUIRE(r.result == CUDA_SUCCESS);
  return r.as<proto::VmmHandleRep>().handle;
}

// The fd the server sent on the client's socket before its answer.
proto::UniqueFd received_fd(TestClient& client) {
  proto::Received message;
  REQUIRE(proto::receive_message(client.socket(), message) == 0);
  REQUIRE(message.fds.size() == 1);
  return std::move(message.fds[0]);
}

// What a client's export hands the application: the handle in a sealed memfd.
proto::IpcHandle shared(TestClient& client, proto::WireHandle handle) {
  REQUIRE(client.call(Op::kVmmShare, proto::HandleReq{handle}).result == CUDA_SUCCESS);
  proto::UniqueFd memfd = received_fd(client);
  CHECK((::fcntl(memfd.get(), F_GET_SEALS) & F_SEAL_WRITE) != 0);
  proto::IpcHandle out{};
  REQUIRE(::pread(memfd.get(), &out, sizeof out, 0) == static_cast<ssize_t>(sizeof out));
  CHECK(::pwrite(memfd.get(), &out, 1, 0) < 0);  // sealed: nobody changes it
  CHECK(out.kind == static_cast<std::uint16_t>(proto::IpcKind::kVmm));
  return out;
}

Reply open(TestClient& client, const proto::IpcHandle& handle) {
  return client.call(Op::kVmmOpen, proto::VmmOpenReq{handle});
}

std::uint64_t memory_used(Harness& h, TestClient& client) {
  return h.server->find_session(client.welcome().client_id)->charge.used();
}

TEST_CASE(
    "a shared physical allocation opens for the exporter's user only, with the policy "
    "logged; the opener gets the driver's fd",
    "[server][vmm][ipc]") {
  Harness h;
  TestClient alice(h, admitted_as(kAlice, 5001));
  TestClient bob(h, admitted_as(kBob, 5002));
  TestClient alice_peer(h, admitted_as(kAlice, 5003));
  const proto::WireHandle handle = create_exportable(alice, 4 * kMiB);
  const proto::IpcHandle first = shared(alice, handle);
  // Shared again: the same handle, one driver export.
  const proto::IpcHandle again = shared(alice, handle);
  CHECK(std::memcmp(&first, &again, sizeof first) == 0);
  CHECK(fake_gpu().vmm_exports == 1);

  CHECK(open(bob, first).result == CUDA_ERROR_INVALID_HANDLE);
  CHECK(
      h.logged("(uid 1001) tried to import an IPC VMM memory handle exported by uid 1000: only "
               "clients of the same user may open each other's handles"));
  CHECK(bob.call_empty(Op::kPing).result == CUDA_SUCCESS);

  proto::IpcHandle forged = first;
  forged.secret[0] ^= 1;
  CHECK(open(alice_peer, forged).result == CUDA_ERROR_INVALID_HANDLE);

  Reply opened = open(alice_peer, first);
  REQUIRE(opened.result == CUDA_SUCCESS);
  CHECK(opened.as<proto::VmmOpenRep>().bytes == 4 * kMiB);
  proto::UniqueFd driver_fd = received_fd(alice_peer);
  char name[64] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(driver_fd.get());
  REQUIRE(::readlink(link.c_str(), name, sizeof name - 1) > 0);
  CHECK(std::string(name).find("fake-vmm-export") != std::string::npos);
  // A process may import its own export, as with the driver.
  REQUIRE(open(alice, first).result == CUDA_SUCCESS);
  received_fd(alice);
  // A cuIpc memory handle names no VMM entry, nor the reverse.
  proto::IpcHandle as_memory = first;
  as_memory.kind = static_cast<std::uint16_t>(proto::IpcKind::kMemory);
  CHECK(open(alice_peer, as_memory).result == CUDA_ERROR_INVALID_VALUE);

  const auto open_id = opened.as<proto::VmmOpenRep>().open;
  CHECK(alice_peer.call(Op::kVmmClose, proto::HandleReq{open_id}).result == CUDA_SUCCESS);
  CHECK(alice_peer.call(Op::kVmmClose, proto::HandleReq{open_id}).result ==
        CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE(
    "released by its exporter while opened, a shared allocation stays charged to the "
    "exporter until the last open ends; later imports are refused",
    "[server][vmm][ipc]") {
  Harness h;
  TestClient exporter(h, admitted_as(kAlice, 5101, 16 * kMiB));
  TestClient first(h, admitted_as(kAlice, 5102));
  TestClient second(h, admitted_as(kAlice, 5103));
  const proto::WireHandle handle = create_exportable(exporter, 6 * kMiB);
  const proto::IpcHandle token = shared(exporter, handle);
  Reply a = open(first, token);
  REQUIRE(a.result == CUDA_SUCCESS);
  received_fd(first);
  REQUIRE(open(second, token).result == CUDA_SUCCESS);
  received_fd(second);
  CHECK(memory_used(h, first) == 0);  // an opener is charged nothing

  REQUIRE(exporter.call(Op::kVmmRelease, proto::HandleReq{handle}).result == CUDA_SUCCESS);
  CHECK(h.logged("that other clients have open: it stays charged to it"));
  CHECK(memory_used(h, exporter) == 6 * kMiB);
  CHECK(open(first, token).result == CUDA_ERROR_INVALID_HANDLE);  // no longer exported

  // One open ends with its close, the other with its session.
  REQUIRE(first.call(Op::kVmmClose, proto::HandleReq{a.as<proto::VmmOpenRep>().open}).result ==
          CUDA_SUCCESS);
  CHECK(memory_used(h, exporter) == 6 * kMiB);
  second.hang_up();
  CHECK(h.pump_until([&] { return h.logged("closed the last open of a shared physical"); }));
  // The exporter's worker takes the bytes back at its next charge or memory query.
  REQUIRE(exporter.call(Op::kMemGetInfo, proto::CtxReq{0}).result != CUDA_ERROR_UNKNOWN);
  CHECK(memory_used(h, exporter) == 0);
  CHECK(h.server->ipc_registry().memory_entries() == 0);
}

}  // namespace
}  // namespace mpsshim::server::test

// Virtual memory management on the server: a client's physical allocations, reservations and
// mappings are its own, count against its limit, and go back to the driver in the driver's
// order (unmap, release, free) when its session ends (ops/vmm.cpp, docs/vmm.md).
#include <catch2/catch.hpp>

#include "proto/ops_vmm.hpp"
#include "tests/server/fake_driver.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kGranule = 2 * kMiB;

proto::VmmProp device_prop() {
  proto::VmmProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
  return prop;
}

Reply create(TestClient& client, std::uint64_t bytes) {
  return client.call(Op::kVmmCreate, proto::VmmCreateReq{device_prop(), 0, bytes, 0});
}

std::uint64_t reserve(TestClient& client, std::uint64_t bytes) {
  Reply r = client.call(Op::kVmmReserve, proto::VmmReserveReq{bytes, 0, 0, 0});
  REQUIRE(r.result == CUDA_SUCCESS);
  return r.as<proto::VmmAddressRep>().address;
}

CUresult map(TestClient& client, std::uint64_t address, std::uint64_t bytes,
             proto::WireHandle handle) {
  return client.call(Op::kVmmMap, proto::VmmMapReq{address, bytes, 0, handle, 0}).result;
}

CUresult set_access(TestClient& client, std::uint64_t address, std::uint64_t bytes,
                    std::uint32_t flags) {
  proto::VmmAccessDesc desc{CU_MEM_LOCATION_TYPE_DEVICE, flags};
  std::vector<std::byte> trailing(sizeof desc);
  std::memcpy(trailing.data(), &desc, sizeof desc);
  return client.call(Op::kVmmSetAccess, proto::VmmSetAccessReq{address, bytes, 1, 0}, trailing)
      .result;
}

std::uint64_t memory_used(Harness& h, TestClient& client) {
  return h.server->find_session(client.welcome().client_id)->charge.used();
}

TEST_CASE("VMM memory counts against the limit until released and unmapped", "[server][vmm]") {
  Harness h;
  auto hello = default_hello(1, "vmm");
  hello.device_memory_limit = 8 * kMiB;
  TestClient sut(h, hello);

  CHECK(create(sut, 10 * kMiB).result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(h.logged("device memory (cuMemCreate)"));
  Reply first = create(sut, 6 * kMiB);
  REQUIRE(first.result == CUDA_SUCCESS);
  const auto handle = first.as<proto::VmmHandleRep>().handle;
  CHECK(memory_used(h, sut) == 6 * kMiB);
  CHECK(create(sut, 4 * kMiB).result == CUDA_ERROR_OUT_OF_MEMORY);

  const std::uint64_t va = reserve(sut, 4 * kGranule);
  REQUIRE(map(sut, va, 6 * kMiB, handle) == CUDA_SUCCESS);
  REQUIRE(sut.call(Op::kVmmRelease, proto::HandleReq{handle}).result == CUDA_SUCCESS);
  CHECK(memory_used(h, sut) == 6 * kMiB);  // still mapped
  CHECK(fake_gpu().vmm_teardown.empty());
  REQUIRE(sut.call(Op::kVmmUnmap, proto::VmmRangeReq{va, 6 * kMiB}).result == CUDA_SUCCESS);
  CHECK(memory_used(h, sut) == 0);
  CHECK(fake_gpu().vmm_teardown == std::vector<std::string>{"unmap", "release"});
  CHECK(fake_gpu().vmm_handles.empty());
}

TEST_CASE("VMM memory counts against the limit an allocation's clients share",
          "[server][vmm][allocation]") {
  constexpr std::uint32_t kAllocation = 7;
  Harness h;
  auto admission = [](int pid) {
    proto::ServerAdmit admit = admission_of(default_hello(pid, "pod-process"));
    admit.allocation_id = kAllocation;
    admit.allocation_memory_limit = 8 * kMiB;
    return admit;
  };
  TestClient launcher(h, admission(1));
  TestClient worker(h, admission(2));

  Reply held = create(launcher, 6 * kMiB);
  REQUIRE(held.result == CUDA_SUCCESS);
  // The worker alone would fit (4 < 8), not with the launcher's 6.
  CHECK(create(worker, 4 * kMiB).result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(h.logged("its allocation 7 shares a limit of 8 MiB"));
  CHECK(memory_used(h, worker) == 0);
  REQUIRE(launcher.call(Op::kVmmRelease, proto::HandleReq{held.as<proto::VmmHandleRep>().handle})
              .result == CUDA_SUCCESS);
  CHECK(create(worker, 4 * kMiB).result == CUDA_SUCCESS);
  CHECK(memory_used(h, worker) == 4 * kMiB);
}

TEST_CASE("only read-write mappings are memory a copy may name", "[server][vmm]") {
  Harness h;
  TestClient sut(h);
  const auto handle = create(sut, 2 * kGranule).as<proto::VmmHandleRep>().handle;
  const std::uint64_t va = reserve(sut, 4 * kGranule);
  REQUIRE(map(sut, va, 2 * kGranule, handle) == CUDA_SUCCESS);
  Session& session = *h.server->find_session(sut.welcome().client_id);
  CHECK_FALSE(session.memory.contains(va, 16));
  CHECK(set_access(sut, va, kGranule, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
        CUDA_ERROR_NOT_SUPPORTED);  // part of a mapping
  CHECK(set_access(sut, va, 3 * kGranule, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
        CUDA_ERROR_INVALID_VALUE);  // past the mapping
  REQUIRE(set_access(sut, va, 2 * kGranule, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == CUDA_SUCCESS);
  CHECK(session.memory.contains(va, 2 * kGranule));
  REQUIRE(set_access(sut, va, 2 * kGranule, CU_MEM_ACCESS_FLAGS_PROT_READ) == CUDA_SUCCESS);
  CHECK_FALSE(session.memory.contains(va, 16));
  Reply access =
      sut.call(Op::kVmmGetAccess, proto::VmmGetAccessReq{va + 64, CU_MEM_LOCATION_TYPE_DEVICE, 0});
  CHECK(access.as<proto::VmmGetAccessRep>().flags == CU_MEM_ACCESS_FLAGS_PROT_READ);
}

TEST_CASE("another client's VMM handle and addresses name nothing", "[server][vmm]") {
  Harness h;
  TestClient owner(h, default_hello(1, "owner"));
  TestClient thief(h, default_hello(2, "thief"));
  const auto handle = create(owner, kGranule).as<proto::VmmHandleRep>().handle;
  const std::uint64_t owner_va = reserve(owner, kGranule);
  REQUIRE(map(owner, owner_va, kGranule, handle) == CUDA_SUCCESS);

  const std::uint64_t thief_va = reserve(thief, kGranule);
  CHECK(map(thief, thief_va, kGranule, handle) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(thief, owner_va, kGranule, handle) == CUDA_ERROR_INVALID_VALUE);
  CHECK(thief.call(Op::kVmmRelease, proto::HandleReq{handle}).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(thief.call(Op::kVmmRetain, proto::VmmRetainReq{owner_va}).result ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(thief.call(Op::kVmmUnmap, proto::VmmRangeReq{owner_va, kGranule}).result ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_gpu().vmm_mappings.size() == 1);
  CHECK(fake_gpu().vmm_handles.size() == 1);
}

TEST_CASE("a departed client's VMM memory goes back: unmap, release, then free", "[server][vmm]") {
  Harness h;
  TestClient sut(h);
  const auto id = sut.welcome().client_id;
  const auto a = create(sut, kGranule).as<proto::VmmHandleRep>().handle;
  const auto b = create(sut, kGranule).as<proto::VmmHandleRep>().handle;
  const std::uint64_t va = reserve(sut, 8 * kGranule);
  REQUIRE(map(sut, va, kGranule, a) == CUDA_SUCCESS);
  REQUIRE(map(sut, va + kGranule, kGranule, b) == CUDA_SUCCESS);
  REQUIRE(set_access(sut, va, 2 * kGranule, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == CUDA_SUCCESS);

  sut.hang_up();
  REQUIRE(h.pump_until([&] { return h.server->find_session(id) == nullptr; }));

  CHECK(fake_gpu().vmm_teardown ==
        std::vector<std::string>{"unmap", "unmap", "release", "release", "free"});
  CHECK(fake_gpu().vmm_handles.empty());
  CHECK(fake_gpu().vmm_mappings.empty());
  CHECK(fake_gpu().vmm_reservations.empty());
  CHECK(h.logged("2 physical allocations (4 MiB), 2 mappings, 1 address reservation"));
}

}  // namespace
}  // namespace mpsshim::server::test

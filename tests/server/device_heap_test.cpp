// The server's part of the one device address space: the arena's range allocator
// (address_arena.hpp) and cuMemAlloc's memory placed in it with VMM (device_heap.hpp), against the
// fake driver with its reservations at the address asked for, as the real driver was measured to.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "broker/server/driver/address_arena.hpp"
#include "broker/server/driver/device_heap.hpp"
#include "proto/address_arenas.hpp"
#include "tests/server/fake_driver.hpp"

namespace mpsshim::server::test {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kGranule = 2 * kMiB;
constexpr unsigned kGpu = 1;
constexpr std::uint64_t kOwner = 7, kOtherOwner = 8;

int creates = 0;
CUresult create_result = CUDA_SUCCESS;
// The device's memory, when not 0: cuMemCreate past it is out of memory, as the driver's is.
std::uint64_t device_bytes_limit = 0;

// The fake driver, with reservations placed where asked and cuMemCreate counted and failing on
// demand.
DriverTable honouring_driver() {
  fake_gpu().reset();
  creates = 0;
  create_result = CUDA_SUCCESS;
  device_bytes_limit = 0;
  DriverTable t = fake_driver_table();
  t.cuMemAddressReserve = [](CUdeviceptr* p, std::size_t bytes, std::size_t, CUdeviceptr want,
                             unsigned long long) {
    *p = want;
    fake_gpu().vmm_reservations[want] = bytes;
    return CUDA_SUCCESS;
  };
  // The heap calls the driver from any thread; the fake's books are not thread-safe.
  static std::mutex books;
  static decltype(t.cuMemCreate) create = nullptr;
  static decltype(t.cuMemMap) map = nullptr;
  static decltype(t.cuMemUnmap) unmap = nullptr;
  static decltype(t.cuMemRelease) release = nullptr;
  create = t.cuMemCreate;
  map = t.cuMemMap;
  unmap = t.cuMemUnmap;
  release = t.cuMemRelease;
  t.cuMemCreate = [](CUmemGenericAllocationHandle* h, std::size_t bytes,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
    std::lock_guard lock(books);
    if (create_result != CUDA_SUCCESS) return create_result;
    std::uint64_t held = 0;
    for (const auto& [handle, size] : fake_gpu().vmm_handles) held += size;
    if (device_bytes_limit != 0 && held + bytes > device_bytes_limit) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ++creates;
    return create(h, bytes, prop, flags);
  };
  t.cuMemMap = [](CUdeviceptr p, std::size_t bytes, std::size_t offset,
                  CUmemGenericAllocationHandle h, unsigned long long flags) {
    std::lock_guard lock(books);
    return map(p, bytes, offset, h, flags);
  };
  t.cuMemUnmap = [](CUdeviceptr p, std::size_t bytes) {
    std::lock_guard lock(books);
    return unmap(p, bytes);
  };
  t.cuMemRelease = [](CUmemGenericAllocationHandle h) {
    std::lock_guard lock(books);
    return release(h);
  };
  return t;
}

}  // namespace

TEST_CASE("the arena hands out aligned ranges, exactly asked ones, and coalesces them back",
          "[device_heap]") {
  constexpr std::uint64_t kBase = proto::arena_base(2);
  AddressArena sut(kBase, 64 * kMiB);

  auto first = sut.take(3 * kMiB, kGranule);
  REQUIRE(first == kBase);
  auto aligned = sut.take(kMiB, 8 * kMiB);
  REQUIRE(aligned == kBase + 8 * kMiB);
  CHECK(sut.take_at(kBase + 4 * kMiB, kMiB));
  CHECK_FALSE(sut.take_at(kBase + 4 * kMiB, kMiB));       // taken
  CHECK_FALSE(sut.take_at(kBase + 63 * kMiB, 2 * kMiB));  // runs off the end
  CHECK_FALSE(sut.take(64 * kMiB, kGranule).has_value());
  CHECK(sut.taken_bytes() == 5 * kMiB);

  sut.give(*first, 3 * kMiB);
  sut.give(kBase + 4 * kMiB, kMiB);
  sut.give(*aligned, kMiB);
  CHECK(sut.taken_bytes() == 0);
  // Coalesced: the whole arena is one range again.
  CHECK(sut.take(64 * kMiB, kGranule) == kBase);
}

TEST_CASE("the heap reserves its GPU's arena at its fixed address", "[device_heap]") {
  DriverTable cu = honouring_driver();
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);
  CHECK(sut->arena().base() == proto::arena_base(kGpu));
  CHECK(fake_gpu().vmm_reservations.count(proto::kArenaWindowBase) == 1);  // the whole window

  SECTION("a driver that places the arena elsewhere leaves the server without one") {
    DriverTable moving = fake_driver_table();
    moving.cuMemAddressReserve = [](CUdeviceptr* p, std::size_t, std::size_t, CUdeviceptr want,
                                    unsigned long long) {
      *p = want + kGranule;  // somewhere else
      return CUDA_SUCCESS;
    };
    moving.cuMemAddressFree = [](CUdeviceptr, std::size_t) { return CUDA_SUCCESS; };
    CHECK(DeviceHeap::open(moving, 0, kGpu, &why) == nullptr);
    CHECK_THAT(why, Catch::Contains("instead of"));
  }
  SECTION("a GPU past the last arena has none") {
    CHECK(DeviceHeap::open(cu, 0, proto::kMaxArenas, &why) == nullptr);
  }
}

TEST_CASE("small allocations share their owner's chunk; large ones are their own",
          "[device_heap]") {
  DriverTable cu = honouring_driver();
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);

  auto a = sut->allocate(kOwner, 1000);
  auto b = sut->allocate(kOwner, 64 * 1024);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(creates == 1);  // one chunk
  CHECK(*a % DeviceHeap::kSmallAlignment == 0);
  CHECK(*b % DeviceHeap::kSmallAlignment == 0);
  CHECK(*b - *a >= 1000);
  auto other = sut->allocate(kOtherOwner, 1000);
  REQUIRE(other);
  CHECK(creates == 2);  // owners never share a chunk
  auto large = sut->allocate(kOwner, 5 * kMiB);
  REQUIRE(large);
  CHECK(creates == 3);
  CHECK(*large % kGranule == 0);
  for (CUdeviceptr p : {*a, *b, *other, *large}) {
    CHECK(proto::arena_holding(p) == static_cast<int>(kGpu));
    CHECK(sut->owns(p));
  }
  CHECK(sut->figures().physical_bytes == 2 * kGranule + 6 * kMiB);  // rounded to granules
  CHECK_FALSE(sut->owns(*a + 512));

  CHECK(sut->free(*large) == CUDA_SUCCESS);
  CHECK(sut->free(*large) == CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_gpu().vmm_handles.size() == 2);

  // The emptied chunk stays as the owner's spare: the next small allocation makes no chunk.
  CHECK(sut->free(*a) == CUDA_SUCCESS);
  CHECK(sut->free(*b) == CUDA_SUCCESS);
  CHECK(fake_gpu().vmm_handles.size() == 2);
  auto again = sut->allocate(kOwner, 4096);
  REQUIRE(again);
  CHECK(creates == 3);
  CHECK(sut->free(*again) == CUDA_SUCCESS);

  // The owner's end gives its spare back; the other owner's chunk stays.
  sut->forget_owner(kOwner);
  CHECK(fake_gpu().vmm_handles.size() == 1);
  CHECK(sut->free(*other) == CUDA_SUCCESS);
  sut->forget_owner(kOtherOwner);
  CHECK(fake_gpu().vmm_handles.empty());
  CHECK(fake_gpu().vmm_mappings.empty());
  CHECK(sut->arena().taken_bytes() == 0);
}

TEST_CASE("an allocation freed after its owner ended gives its chunk back", "[device_heap]") {
  // As when the last opener of an exported allocation closes it after the exporter ended.
  DriverTable cu = honouring_driver();
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);
  auto kept = sut->allocate(kOwner, 4096);
  REQUIRE(kept);
  sut->forget_owner(kOwner);
  CHECK(fake_gpu().vmm_handles.size() == 1);  // still in use
  CHECK(sut->free(*kept) == CUDA_SUCCESS);
  CHECK(fake_gpu().vmm_handles.empty());
}

TEST_CASE("the driver's out-of-memory reaches the caller and leaves the arena as it was",
          "[device_heap]") {
  DriverTable cu = honouring_driver();
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);
  create_result = CUDA_ERROR_OUT_OF_MEMORY;
  auto small = sut->allocate(kOwner, 100);
  auto large = sut->allocate(kOwner, 64 * kMiB);
  REQUIRE_FALSE(small);
  REQUIRE_FALSE(large);
  CHECK(small.error() == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(large.error() == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(sut->arena().taken_bytes() == 0);
  // More than the arena holds is out of memory without asking the driver.
  create_result = CUDA_SUCCESS;
  auto huge = sut->allocate(kOwner, proto::kArenaBytes + 1);
  REQUIRE_FALSE(huge);
  CHECK(huge.error() == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(creates == 0);
}

TEST_CASE(
    "memory kept for a handover makes its owner's next large allocation, cleared; what is left "
    "goes back at its end",
    "[device_heap][preemption]") {
  DriverTable cu = honouring_driver();
  // What the heap clears, by range (the fake's memset would write to the arena's addresses).
  static std::vector<std::pair<CUdeviceptr, std::size_t>> cleared;
  cleared.clear();
  cu.cuMemsetD8Async = [](CUdeviceptr d, unsigned char v, std::size_t n, CUstream) {
    if (v != 0) return CUDA_ERROR_INVALID_VALUE;
    cleared.emplace_back(d, n);
    return CUDA_SUCCESS;
  };
  // The heap waits for the clearing (the fake refuses to block the server elsewhere).
  static int waits;
  waits = 0;
  cu.cuStreamSynchronize = [](CUstream) {
    ++waits;
    return CUDA_SUCCESS;
  };
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);
  // Physical allocations of a client being suspended (its own cuMemCreate memory).
  auto physical = [&](std::uint64_t bytes) {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop{};
    REQUIRE(cu.cuMemCreate(&h, bytes, &prop, 0) == CUDA_SUCCESS);
    return h;
  };
  const auto first = physical(4 * kMiB), second = physical(2 * kMiB), third = physical(4 * kMiB);
  CHECK_FALSE(sut->keep_for_handover(kOtherOwner, first, 4 * kMiB));  // no handover on
  sut->start_handover(kOwner);
  CHECK_FALSE(sut->keep_for_handover(kOwner, first, 4 * kMiB));       // its own memory
  CHECK_FALSE(sut->keep_for_handover(kOtherOwner, first, 3 * kMiB));  // not whole granules
  CHECK(sut->keep_for_handover(kOtherOwner, first, 4 * kMiB));
  CHECK(sut->keep_for_handover(kOtherOwner, second, 2 * kMiB));
  CHECK(sut->keep_for_handover(kOtherOwner, third, 4 * kMiB));
  CHECK(sut->handover_bytes() == 10 * kMiB);

  // Another owner's allocation gets new memory; small ones never take kept memory.
  const int before = creates;
  auto others = sut->allocate(kOtherOwner, 8 * kMiB);
  auto small = sut->allocate(kOwner, 4096);
  REQUIRE(others);
  REQUIRE(small);
  CHECK(creates == before + 2);
  CHECK(sut->handover_bytes() == 10 * kMiB);

  // 12 MiB: the kept 10 (largest first) and 2 new, mapped one after another; only the kept
  // memory is cleared.
  auto taken = sut->allocate(kOwner, 11 * kMiB + 1);
  REQUIRE(taken);
  CHECK(waits == 1);  // the clearing is waited for before the memory is handed out
  CHECK(creates == before + 3);
  CHECK(sut->handover_bytes() == 0);
  std::uint64_t cleared_bytes = 0;
  for (const auto& [at, bytes] : cleared) {
    CHECK(at >= *taken);
    CHECK(at + bytes <= *taken + 10 * kMiB);
    cleared_bytes += bytes;
  }
  CHECK(cleared_bytes == 10 * kMiB);
  CHECK(fake_gpu().vmm_mappings.count(*taken) == 1);
  CHECK(fake_gpu().vmm_mappings.count(*taken + 4 * kMiB) == 1);
  CHECK(fake_gpu().vmm_mappings.count(*taken + 8 * kMiB) == 1);
  CHECK(fake_gpu().vmm_mappings.count(*taken + 10 * kMiB) == 1);
  // Exported for another GPU's server: the physical allocation holding the address, alone.
  auto exported = sut->export_block(kOwner, *taken + 5 * kMiB);
  REQUIRE(exported);
  ::close(exported->fd);
  CHECK(exported->base == *taken + 4 * kMiB);
  CHECK(exported->bytes == 4 * kMiB);

  // Freed, every piece goes back to the driver.
  const std::size_t handles = fake_gpu().vmm_handles.size();
  CHECK(sut->free(*taken) == CUDA_SUCCESS);
  CHECK(fake_gpu().vmm_handles.size() == handles - 4);
  CHECK(fake_gpu().vmm_handles.count(first) == 0);
  sut->end_handover();

  // What the allocation did not take goes back when the handover ends; none is kept after it.
  sut->start_handover(kOwner);
  const auto fourth = physical(4 * kMiB), fifth = physical(4 * kMiB);
  CHECK(sut->keep_for_handover(kOtherOwner, fourth, 4 * kMiB));
  CHECK(sut->keep_for_handover(kOtherOwner, fifth, 4 * kMiB));
  auto part = sut->allocate(kOwner, 4 * kMiB);
  REQUIRE(part);
  CHECK(sut->handover_bytes() == 4 * kMiB);
  sut->end_handover();
  CHECK(sut->handover_bytes() == 0);
  CHECK(fake_gpu().vmm_handles.size() == handles - 4 + 1);  // the one `part` holds
  CHECK_FALSE(sut->keep_for_handover(kOtherOwner, physical(2 * kMiB), 2 * kMiB));
  for (CUdeviceptr p : {*part, *others, *small}) CHECK(sut->free(p) == CUDA_SUCCESS);
}

TEST_CASE(
    "an allocation that cannot be made of the kept memory gets room by giving it back, large "
    "or small",
    "[device_heap][preemption]") {
  DriverTable cu = honouring_driver();
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);
  device_bytes_limit = 10 * kMiB;
  auto keep = [&](std::uint64_t bytes) {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop{};
    REQUIRE(cu.cuMemCreate(&h, bytes, &prop, 0) == CUDA_SUCCESS);
    REQUIRE(sut->keep_for_handover(kOtherOwner, h, bytes));
    return h;
  };
  sut->start_handover(kOwner);
  // 8 MiB kept of 10: 4 MiB new do not fit beside them, and the kept piece is too large for it.
  const auto large = keep(8 * kMiB);
  auto four = sut->allocate(kOwner, 4 * kMiB);
  REQUIRE(four);
  CHECK(sut->handover_bytes() == 0);
  CHECK(fake_gpu().vmm_handles.count(large) == 0);
  // A small allocation's chunk likewise.
  keep(6 * kMiB);
  auto small = sut->allocate(kOwner, 4096);
  REQUIRE(small);
  CHECK(sut->handover_bytes() == 0);
  // Another owner's allocation never takes it, nor makes it go.
  keep(4 * kMiB);
  auto others = sut->allocate(kOtherOwner, 2 * kMiB);
  REQUIRE_FALSE(others);
  CHECK(others.error() == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(sut->handover_bytes() == 4 * kMiB);
  sut->end_handover();
  CHECK(fake_gpu().vmm_handles.size() == 2);  // `four` and the chunk of `small`
  for (CUdeviceptr p : {*four, *small}) CHECK(sut->free(p) == CUDA_SUCCESS);
}

// A heap whose memsets are recorded (the fake's would write to the arena's addresses) and whose
// waits return at once, cuMemMap counted.
struct HandoverFixture {
  static inline std::vector<std::pair<CUdeviceptr, std::size_t>> cleared;
  static inline int maps = 0;
  static inline decltype(DriverTable::cuMemMap) map = nullptr;
  DriverTable cu = honouring_driver();
  std::unique_ptr<DeviceHeap> sut;

  HandoverFixture() {
    cleared.clear();
    maps = 0;
    cu.cuMemsetD8Async = [](CUdeviceptr d, unsigned char v, std::size_t n, CUstream) {
      if (v != 0) return CUDA_ERROR_INVALID_VALUE;
      cleared.emplace_back(d, n);
      return CUDA_SUCCESS;
    };
    cu.cuStreamSynchronize = [](CUstream) { return CUDA_SUCCESS; };
    map = cu.cuMemMap;
    cu.cuMemMap = [](CUdeviceptr p, std::size_t bytes, std::size_t offset,
                     CUmemGenericAllocationHandle h, unsigned long long flags) {
      ++maps;
      return map(p, bytes, offset, h, flags);
    };
    std::string why;
    sut = DeviceHeap::open(cu, 0, kGpu, &why);
    REQUIRE(sut != nullptr);
  }
  // A physical allocation of a client being suspended.
  CUmemGenericAllocationHandle physical(std::uint64_t bytes) {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop{};
    REQUIRE(cu.cuMemCreate(&h, bytes, &prop, 0) == CUDA_SUCCESS);
    return h;
  }
  // What vmm_park does for the suspend's copy: the whole allocation mapped at its view.
  void map_view(CUdeviceptr at, CUmemGenericAllocationHandle h, std::uint64_t bytes) {
    REQUIRE(cu.cuMemMap(at, bytes, 0, h, 0) == CUDA_SUCCESS);
  }
};

TEST_CASE(
    "views a suspend made in the addresses a handover prepared become its allocation, mapped "
    "there already",
    "[device_heap][preemption]") {
  HandoverFixture f;
  DeviceHeap& sut = *f.sut;
  const std::uint64_t taken_before = sut.arena().taken_bytes();
  CHECK_FALSE(sut.place_handover_view(kOtherOwner, 4 * kMiB, kGranule));  // no handover on
  sut.start_handover(kOwner, 15 * kMiB + 1);
  // The allocation's 16 MiB are taken at once.
  CHECK(sut.arena().taken_bytes() == taken_before + 16 * kMiB);
  CHECK_FALSE(sut.place_handover_view(kOwner, 4 * kMiB, kGranule));       // its own memory
  CHECK_FALSE(sut.place_handover_view(kOtherOwner, 3 * kMiB, kGranule));  // not whole granules
  const auto a = sut.place_handover_view(kOtherOwner, 4 * kMiB, kGranule);
  const auto b = sut.place_handover_view(kOtherOwner, 2 * kMiB, kGranule);
  const auto c = sut.place_handover_view(kOtherOwner, 4 * kMiB, kGranule);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(*b == *a + 4 * kMiB);
  CHECK(*c == *a + 6 * kMiB);
  CHECK_FALSE(sut.place_handover_view(kOtherOwner, 8 * kMiB, kGranule));  // 6 MiB left
  const auto ha = f.physical(4 * kMiB), hb = f.physical(2 * kMiB), hc = f.physical(4 * kMiB);
  f.map_view(*a, ha, 4 * kMiB);
  f.map_view(*b, hb, 2 * kMiB);
  f.map_view(*c, hc, 4 * kMiB);
  // The first two suspends went ahead; the third was dropped, its view unmapped: a hole.
  CHECK(sut.keep_for_handover(kOtherOwner, ha, 4 * kMiB, *a));
  CHECK(sut.keep_for_handover(kOtherOwner, hb, 2 * kMiB, *b));
  CHECK_FALSE(sut.keep_for_handover(kOtherOwner, hb, 2 * kMiB, *b));  // kept already
  REQUIRE(f.cu.cuMemUnmap(*c, 4 * kMiB) == CUDA_SUCCESS);
  sut.forget_handover_view(*c, 4 * kMiB);
  // A parked block of the heap's own, kept unmapped, fills the hole before new memory does.
  const auto hd = f.physical(2 * kMiB);
  CHECK(sut.keep_for_handover(kOtherOwner, hd, 2 * kMiB));
  CHECK(sut.handover_bytes() == 8 * kMiB);

  const int maps_before = HandoverFixture::maps, creates_before = creates;
  auto taken = sut.allocate(kOwner, 15 * kMiB + 1);
  REQUIRE(taken);
  CHECK(*taken == *a);
  CHECK(sut.handover_bytes() == 0);
  // Only the hole was mapped: the kept 2 MiB and 8 MiB new; the views stayed as they were.
  CHECK(HandoverFixture::maps == maps_before + 2);
  CHECK(creates == creates_before + 1);
  CHECK(sut.arena().taken_bytes() == taken_before + 16 * kMiB);
  for (std::uint64_t at : {0, 4, 6, 8}) CHECK(fake_gpu().vmm_mappings.count(*a + at * kMiB) == 1);
  // The other clients' 8 MiB cleared in one memset, the new memory not at all.
  REQUIRE(HandoverFixture::cleared.size() == 1);
  CHECK(HandoverFixture::cleared[0] == std::make_pair(*a, std::size_t{8 * kMiB}));
  // Exported for another GPU's server: the view's physical allocation alone.
  auto exported = sut.export_block(kOwner, *a + 5 * kMiB);
  REQUIRE(exported);
  ::close(exported->fd);
  CHECK(exported->base == *a + 4 * kMiB);
  CHECK(exported->bytes == 2 * kMiB);

  sut.end_handover();
  CHECK(sut.free(*taken) == CUDA_SUCCESS);
  for (auto h : {ha, hb, hd}) CHECK(fake_gpu().vmm_handles.count(h) == 0);
  CHECK(fake_gpu().vmm_handles.count(hc) == 1);  // the dropped suspend's client still holds it
  CHECK(fake_gpu().vmm_mappings.empty());
  CHECK(sut.arena().taken_bytes() == taken_before);
}

TEST_CASE(
    "prepared addresses another allocation cannot use are given up: kept views unmapped and "
    "kept, a view still copied through gives its addresses back when its suspend ends",
    "[device_heap][preemption]") {
  HandoverFixture f;
  DeviceHeap& sut = *f.sut;
  const std::uint64_t taken_before = sut.arena().taken_bytes();
  sut.start_handover(kOwner, 8 * kMiB);
  const auto a = sut.place_handover_view(kOtherOwner, 4 * kMiB, kGranule);
  const auto b = sut.place_handover_view(kOtherOwner, 4 * kMiB, kGranule);
  REQUIRE(a);
  REQUIRE(b);
  const auto ha = f.physical(4 * kMiB), hb = f.physical(4 * kMiB);
  f.map_view(*a, ha, 4 * kMiB);
  f.map_view(*b, hb, 4 * kMiB);
  REQUIRE(sut.keep_for_handover(kOtherOwner, ha, 4 * kMiB, *a));
  SECTION("an allocation of another size takes the kept view's memory, mapped elsewhere") {
    auto other = sut.allocate(kOwner, 6 * kMiB);
    REQUIRE(other);
    CHECK(fake_gpu().vmm_mappings.count(*a) == 0);
    CHECK(fake_gpu().vmm_mappings.count(*b) == 1);  // its suspend still copies through it
    CHECK(fake_gpu().vmm_mappings.count(*other) == 1);
    CHECK(fake_gpu().vmm_mappings.count(*other + 4 * kMiB) == 1);
    // b's suspend ends after the addresses were given up: not kept, its addresses go back.
    CHECK_FALSE(sut.keep_for_handover(kOtherOwner, hb, 4 * kMiB, *b));
    REQUIRE(f.cu.cuMemUnmap(*b, 4 * kMiB) == CUDA_SUCCESS);
    sut.forget_handover_view(*b, 4 * kMiB);
    sut.end_handover();
    CHECK(sut.free(*other) == CUDA_SUCCESS);
    CHECK(fake_gpu().vmm_handles.count(ha) == 0);
  }
  SECTION("the waited allocation while a suspend still copies through its addresses") {
    auto same = sut.allocate(kOwner, 8 * kMiB);
    REQUIRE(same);
    CHECK(*same != *a);
    CHECK(fake_gpu().vmm_mappings.count(*b) == 1);
    sut.end_handover();
    REQUIRE(f.cu.cuMemUnmap(*b, 4 * kMiB) == CUDA_SUCCESS);
    sut.forget_handover_view(*b, 4 * kMiB);
    CHECK(sut.free(*same) == CUDA_SUCCESS);
  }
  SECTION("no room for the new part: the driver's error, the kept memory back to the driver") {
    REQUIRE(f.cu.cuMemUnmap(*b, 4 * kMiB) == CUDA_SUCCESS);
    sut.forget_handover_view(*b, 4 * kMiB);
    create_result = CUDA_ERROR_OUT_OF_MEMORY;
    auto none = sut.allocate(kOwner, 8 * kMiB);
    REQUIRE_FALSE(none);
    CHECK(none.error() == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(fake_gpu().vmm_handles.count(ha) == 0);
    CHECK(sut.handover_bytes() == 0);
    sut.end_handover();
  }
  CHECK(fake_gpu().vmm_handles.count(hb) == 1);  // the suspended client's, never the heap's
  CHECK(fake_gpu().vmm_mappings.empty());
  CHECK(sut.arena().taken_bytes() == taken_before);
}

TEST_CASE("allocations from several threads never overlap", "[device_heap]") {
  DriverTable cu = honouring_driver();
  std::string why;
  auto sut = DeviceHeap::open(cu, 0, kGpu, &why);
  REQUIRE(sut != nullptr);
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::vector<std::pair<CUdeviceptr, std::uint64_t>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::uint64_t bytes = (i % 7 == 0) ? 3 * kMiB : 512 * (1 + i % 40);
        // Two threads share an owner, as two workers freeing one client's IPC memory may.
        auto p = sut->allocate(static_cast<std::uint64_t>(t / 2), bytes);
        if (p) got[t].emplace_back(*p, bytes);
        if (i % 3 == 0 && !got[t].empty()) {
          sut->free(got[t].front().first);
          got[t].erase(got[t].begin());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::map<CUdeviceptr, std::uint64_t> all;
  for (const auto& list : got) {
    for (const auto& [p, bytes] : list) all.emplace(p, bytes);
  }
  CUdeviceptr end = 0;
  for (const auto& [p, bytes] : all) {
    CHECK(p >= end);
    end = p + bytes;
  }
  for (const auto& [p, bytes] : all) CHECK(sut->free(p) == CUDA_SUCCESS);
}

}  // namespace mpsshim::server::test

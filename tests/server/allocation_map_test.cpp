#include "broker/server/session/allocation_map.hpp"

#include <catch2/catch.hpp>
#include <limits>

namespace mpsshim::server {
namespace {

constexpr std::uint64_t kBase = 0x7f0000000000;
constexpr std::uint64_t kBytes = 4096;
constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

AllocationMap one_allocation() {
  AllocationMap map;
  map.add(DeviceRange{kBase, kBytes, RangeKind::kAllocation, 1});
  return map;
}

TEST_CASE("ranges inside an allocation are the client's", "[server][allocation_map]") {
  AllocationMap sut = one_allocation();
  CHECK(sut.contains(kBase, kBytes));
  CHECK(sut.contains(kBase, 1));
  CHECK(sut.contains(kBase + kBytes - 1, 1));
  CHECK(sut.contains(kBase + 100, 200));
}

TEST_CASE("ranges outside or straddling an allocation are not", "[server][allocation_map]") {
  AllocationMap sut = one_allocation();
  CHECK_FALSE(sut.contains(kBase - 1, 1));
  CHECK_FALSE(sut.contains(kBase + kBytes, 1));
  CHECK_FALSE(sut.contains(kBase - 1, 2));           // straddles the start
  CHECK_FALSE(sut.contains(kBase + kBytes - 1, 2));  // straddles the end
  CHECK_FALSE(sut.contains(kBase, kBytes + 1));
  CHECK_FALSE(sut.contains(0, 1));
}

TEST_CASE("a range spanning two adjacent allocations is refused", "[server][allocation_map]") {
  AllocationMap sut = one_allocation();
  sut.add(DeviceRange{kBase + kBytes, kBytes, RangeKind::kAllocation, 1});
  CHECK(sut.contains(kBase + kBytes, kBytes));
  CHECK_FALSE(sut.contains(kBase + kBytes - 8, 16));
}

TEST_CASE("a range may run on through back-to-back VMM mappings, and only through them",
          "[server][allocation_map][vmm]") {
  AllocationMap sut;
  for (std::uint64_t i = 0; i < 3; ++i) {
    sut.add(DeviceRange{kBase + i * kBytes, kBytes, RangeKind::kMapped, 10 + i});
  }
  CHECK(sut.contains(kBase + kBytes - 8, 16));       // one boundary
  CHECK(sut.contains(kBase + 1, 3 * kBytes - 1));    // two boundaries, to the end
  CHECK_FALSE(sut.contains(kBase + 1, 3 * kBytes));  // one byte past the last mapping
  sut.add(DeviceRange{kBase + 3 * kBytes, kBytes, RangeKind::kAllocation, 1});
  CHECK_FALSE(sut.contains(kBase + 3 * kBytes - 8, 16));  // into cuMemAlloc memory
  sut.add(DeviceRange{kBase + 5 * kBytes, kBytes, RangeKind::kMapped, 20});
  sut.add(DeviceRange{kBase + 6 * kBytes + 4096, kBytes, RangeKind::kMapped, 21});
  CHECK_FALSE(sut.contains(kBase + 6 * kBytes - 8, 16));  // a gap between mappings
}

TEST_CASE("a range may run on through another GPU's block mapped a physical allocation at a time",
          "[server][allocation_map][peer]") {
  AllocationMap sut;
  sut.add(DeviceRange{kBase, kBytes, RangeKind::kPeer, 0});
  sut.add(DeviceRange{kBase + kBytes, 2 * kBytes, RangeKind::kPeer, 0});
  CHECK(sut.contains(kBase + 8, 3 * kBytes - 8));
  CHECK_FALSE(sut.contains(kBase + 8, 3 * kBytes));  // past the last piece
  // Not from a peer range into another kind, nor from a mapping into a peer range.
  sut.add(DeviceRange{kBase + 3 * kBytes, kBytes, RangeKind::kMapped, 10});
  CHECK_FALSE(sut.contains(kBase + 3 * kBytes - 8, 16));
  sut.add(DeviceRange{kBase + 4 * kBytes, kBytes, RangeKind::kPeer, 0});
  CHECK_FALSE(sut.contains(kBase + 4 * kBytes - 8, 16));
}

TEST_CASE("zero bytes touch nothing and are always fine", "[server][allocation_map]") {
  AllocationMap sut = one_allocation();
  CHECK(sut.contains(kBase, 0));
  CHECK(sut.contains(kBase + kBytes, 0));
  CHECK(sut.contains(0, 0));
  AllocationMap empty;
  CHECK(empty.contains(12345, 0));
}

TEST_CASE("ranges that wrap past 2^64 are refused", "[server][allocation_map]") {
  AllocationMap sut;
  CHECK_FALSE(sut.add(DeviceRange{kMax - 10, 100, RangeKind::kAllocation, 1}));
  sut.add(DeviceRange{kMax - 100, 100, RangeKind::kAllocation, 1});  // ends exactly at 2^64 - 1
  CHECK(sut.contains(kMax - 100, 100));
  CHECK_FALSE(sut.contains(kMax - 100, 101));
  CHECK_FALSE(sut.contains(kMax - 50, kMax));
  CHECK_FALSE(sut.contains(kMax, kMax));
}

TEST_CASE("a base is remembered once, and removal forgets it", "[server][allocation_map]") {
  AllocationMap sut = one_allocation();
  CHECK_FALSE(sut.add(DeviceRange{kBase, kBytes, RangeKind::kGlobal, 2}));
  REQUIRE(sut.find(kBase) != nullptr);
  CHECK(sut.find(kBase)->kind == RangeKind::kAllocation);

  auto removed = sut.remove(kBase);
  REQUIRE(removed);
  CHECK(removed->bytes == kBytes);
  CHECK_FALSE(sut.contains(kBase, 1));
  CHECK_FALSE(sut.remove(kBase));
}

TEST_CASE("remove_if takes the matching ranges", "[server][allocation_map]") {
  AllocationMap sut;
  sut.add(DeviceRange{0x1000, 16, RangeKind::kAllocation, 1});
  sut.add(DeviceRange{0x2000, 16, RangeKind::kGlobal, 9});
  sut.add(DeviceRange{0x3000, 16, RangeKind::kGlobal, 8});

  auto removed = sut.remove_if([](const DeviceRange& r) { return r.owner == 9; });

  REQUIRE(removed.size() == 1);
  CHECK(removed[0].base == 0x2000);
  CHECK(sut.size() == 2);
}

}  // namespace
}  // namespace mpsshim::server

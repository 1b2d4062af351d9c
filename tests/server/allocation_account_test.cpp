// An allocation's shared memory account (broker/server/accounting/allocation_account.hpp): charges
// from several threads never pass the limit together.
#include "broker/server/accounting/allocation_account.hpp"

#include <catch2/catch.hpp>

#include <thread>
#include <vector>

namespace mpsshim::server {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TEST_CASE("an allocation's account refuses the charge that would pass its limit",
          "[server][allocation]") {
  AllocationAccount sut(7, 64 * kMiB);

  CHECK(sut.try_charge(40 * kMiB));
  CHECK_FALSE(sut.try_charge(32 * kMiB));
  CHECK(sut.used() == 40 * kMiB);
  sut.release(40 * kMiB);
  CHECK(sut.try_charge(32 * kMiB));
  sut.release(1024 * kMiB);  // never below zero
  CHECK(sut.used() == 0);
  CHECK(AllocationAccount(8, 0).try_charge(~std::uint64_t{0}));  // 0: no limit
}

TEST_CASE("charges from four threads at once add up to at most the limit", "[server][allocation]") {
  constexpr int kThreads = 4;
  constexpr int kChargesEach = 10000;
  constexpr std::uint64_t kLimit = 1000;
  AllocationAccount sut(1, kLimit);
  std::vector<int> granted(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&sut, &granted, t] {
      for (int i = 0; i < kChargesEach; ++i) granted[t] += sut.try_charge(1) ? 1 : 0;
    });
  }
  for (auto& thread : threads) thread.join();

  int total = 0;
  for (int g : granted) total += g;
  CHECK(total == static_cast<int>(kLimit));
  CHECK(sut.used() == kLimit);
}

}  // namespace
}  // namespace mpsshim::server

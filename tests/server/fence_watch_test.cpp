// The watch page of a session's host fences (HostFences::open_watch_page): the first fences'
// words, seen land by the client's read-only mapping; a page the driver refuses to register
// leaves the fences working on a private page, with nothing watched.
#include <sys/mman.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <vector>

#include "broker/server/driver/host_fences.hpp"
#include "tests/server/fake_driver.hpp"

namespace mpsshim::server {
namespace {

using test::fake_gpu;

CUstream some_stream() {
  return reinterpret_cast<CUstream>(0x51);
}

TEST_CASE("the client's read-only view of the watch page sees its fences land",
          "[server][host_fences][fence_watch]") {
  fake_gpu().reset();
  const DriverTable cu = test::fake_driver_table();
  HostFences fences;
  auto fd = fences.open_watch_page();
  REQUIRE(fd);
  void* view = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd->get(), 0);
  REQUIRE(view != MAP_FAILED);
  const auto* words = static_cast<const std::uint32_t*>(view);

  fake_gpu().busy = true;
  auto fence = fences.arm(cu, some_stream());
  REQUIRE(fence);
  CHECK(fences.watched(*fence));
  CHECK(fake_gpu().host_registrations.size() == 1);
  CHECK_FALSE(fences.reached(*fence));
  CHECK(__atomic_load_n(&words[fence->word], __ATOMIC_SEQ_CST) != fence->value);

  test::finish_fake_work();
  CHECK(fences.reached(*fence));
  CHECK(__atomic_load_n(&words[fence->word], __ATOMIC_SEQ_CST) == fence->value);

  // Past the watch page's 1024 words the fences are private: nothing of them is watched.
  std::vector<HostFence> more;
  for (std::size_t i = 0; i < HostFences::kWordsPerPage; ++i) {
    auto next = fences.arm(cu, some_stream());
    REQUIRE(next);
    more.push_back(*next);
  }
  CHECK_FALSE(fences.watched(more.back()));
  CHECK(fences.pages() == 2);
  fences.release_all(cu);
  CHECK(fake_gpu().host_registrations.empty());
  ::munmap(view, 4096);
}

TEST_CASE("a watch page the driver refuses leaves the fences on a private page",
          "[server][host_fences][fence_watch]") {
  fake_gpu().reset();
  const DriverTable cu = test::fake_driver_table();
  HostFences fences;
  REQUIRE(fences.open_watch_page());
  fake_gpu().host_register_failures = 1;

  auto fence = fences.arm(cu, some_stream());
  REQUIRE(fence);  // host fences stay on for the session
  CHECK_FALSE(fences.watched(*fence));
  CHECK(fences.pages() == 1);
  test::finish_fake_work();
  CHECK(fences.reached(*fence));
  fences.release_all(cu);
  CHECK(fake_gpu().host_registrations.empty());
}

}  // namespace
}  // namespace mpsshim::server

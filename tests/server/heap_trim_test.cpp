// The heap trimmer (broker/server/core/heap_trim.hpp): it trims only after a session was freed and
// at most once per interval, and a trim gives back what a worker thread's arena kept.
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "broker/server/core/heap_trim.hpp"

namespace mpsshim::server {
namespace {

using Clock = std::chrono::steady_clock;

TEST_CASE("the heap is trimmed only after a session was freed, at most once per interval",
          "[server][heap_trim]") {
  HeapTrimmer trimmer;
  const auto t0 = Clock::now();
  trimmer.maybe_trim(t0);
  CHECK(trimmer.trims() == 0);  // nothing was freed

  trimmer.session_freed();
  trimmer.maybe_trim(t0);
  CHECK(trimmer.trims() == 1);
  trimmer.maybe_trim(t0 + std::chrono::seconds(10));
  CHECK(trimmer.trims() == 1);  // nothing freed since

  trimmer.session_freed();
  trimmer.maybe_trim(t0 + HeapTrimmer::kMinInterval / 2);
  CHECK(trimmer.trims() == 1);  // too soon
  trimmer.maybe_trim(t0 + HeapTrimmer::kMinInterval * 2);
  CHECK(trimmer.trims() == 2);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizers replace malloc; their malloc_trim gives nothing back.
#else
TEST_CASE("a trim gives back the free memory a worker thread's arena kept", "[server][heap_trim]") {
  constexpr std::size_t kBlock = 32 << 10;  // below the mmap threshold: from the arena
  constexpr std::size_t kBlocks = 8192;     // 256 MiB
  std::vector<char*> kept;
  // As the driver does on a worker: allocate on a thread of its own (its own arena), touch,
  // then free all but every 64th block, so the arena cannot shrink from its top.
  std::thread([&] {
    std::vector<char*> blocks;
    for (std::size_t i = 0; i < kBlocks; ++i) {
      blocks.push_back(new char[kBlock]);
      for (std::size_t b = 0; b < kBlock; b += 4096) blocks.back()[b] = 1;
    }
    for (std::size_t i = 0; i < kBlocks; ++i) {
      if (i % 64 == 0) {
        kept.push_back(blocks[i]);
      } else {
        delete[] blocks[i];
      }
    }
  }).join();

  HeapTrimmer trimmer;
  trimmer.session_freed();
  const std::uint64_t released = trimmer.maybe_trim(Clock::now());
  INFO("resident after the trim: " << (resident_bytes() >> 20) << " MiB");
  CHECK(trimmer.trims() == 1);
  CHECK(released >= (128u << 20));  // ~248 MiB were free in the arena
  for (char* p : kept) delete[] p;
}
#endif

}  // namespace
}  // namespace mpsshim::server

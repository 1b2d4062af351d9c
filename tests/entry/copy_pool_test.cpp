// libshim/copy_pool: a copy split among helper threads writes every byte once, whatever the size
// and alignment, with several application threads copying at once and in a forked child (whose
// helpers did not survive the fork). Run twice by meson: with the machine's default thread count
// and with MPSSHIM_COPY_THREADS=4.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "libshim/copy_pool.hpp"

namespace mpsshim::shim {
namespace {

std::mutex copiers_mutex;
std::set<std::thread::id> copiers;  // threads that copied a part since the last clear

void recording_copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  {
    std::lock_guard lock(copiers_mutex);
    copiers.insert(std::this_thread::get_id());
  }
  std::memcpy(dst, src, bytes);
}

// The threads that copied since the last call, and a fresh start.
std::set<std::thread::id> take_copiers() {
  std::lock_guard lock(copiers_mutex);
  return std::exchange(copiers, {});
}

void plain_copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

std::vector<std::byte> pattern(std::size_t bytes, unsigned seed) {
  std::vector<std::byte> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>(i * 131 + seed * 7 + 3);
  return v;
}

}  // namespace

TEST_CASE("parallel_copy writes every byte and nothing around it", "[copy_pool]") {
  const std::size_t largest = kParallelMinBytes * 5 + kCopyPartBytes / 3;
  const auto src = pattern(largest + 64, 1);
  std::vector<std::byte> dst(largest + 64);
  for (std::size_t bytes : {kParallelMinBytes - 1, kParallelMinBytes, kParallelMinBytes + 1,
                            kParallelMinBytes + kCopyPartBytes, largest}) {
    for (std::size_t dst_offset : {0, 5}) {
      for (std::size_t src_offset : {0, 3}) {
        std::memset(dst.data(), 0xee, dst.size());
        parallel_copy(dst.data() + dst_offset, src.data() + src_offset, bytes, plain_copy);
        INFO("bytes " << bytes << " dst+" << dst_offset << " src+" << src_offset);
        REQUIRE(std::memcmp(dst.data() + dst_offset, src.data() + src_offset, bytes) == 0);
        auto untouched = [](auto begin, auto end) {
          return std::all_of(begin, end, [](std::byte b) { return b == std::byte{0xee}; });
        };
        REQUIRE(untouched(dst.begin(), dst.begin() + dst_offset));
        REQUIRE(untouched(dst.begin() + dst_offset + bytes, dst.end()));
      }
    }
  }
}

TEST_CASE("a large copy uses the helpers when there are any, the caller alone otherwise",
          "[copy_pool]") {
  const std::size_t bytes = std::size_t{8} << 20;
  const auto src = pattern(bytes, 2);
  std::vector<std::byte> dst(bytes);
  take_copiers();
  // Helpers that slept since the last test wake a few microseconds late; over 200 copies of 32
  // parts each, one that runs at all claims some.
  for (int i = 0; i < 200; ++i) parallel_copy(dst.data(), src.data(), bytes, recording_copy);
  REQUIRE(std::memcmp(dst.data(), src.data(), bytes) == 0);
  const auto large = take_copiers();
  INFO("copy_threads() = " << copy_threads());
  if (copy_threads() > 1) {
    CHECK(large.size() > 1);
    CHECK(large.size() <= static_cast<std::size_t>(copy_threads()));
  } else {
    CHECK(large == std::set{std::this_thread::get_id()});
  }
  // A copy below the threshold never leaves the calling thread.
  parallel_copy(dst.data(), src.data(), kParallelMinBytes - 1, recording_copy);
  CHECK(take_copiers() == std::set{std::this_thread::get_id()});
}

TEST_CASE("application threads copying at once each get their own bytes", "[copy_pool]") {
  constexpr int kThreads = 4;
  constexpr int kCopies = 40;
  const std::size_t bytes = std::size_t{3} << 20;
  std::vector<std::vector<std::byte>> sources;
  for (int t = 0; t < kThreads; ++t) sources.push_back(pattern(bytes, 10 + t));
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> dst(bytes);
      for (int i = 0; i < kCopies; ++i) {
        std::memset(dst.data(), 0, bytes);
        parallel_copy(dst.data(), sources[t].data(), bytes, plain_copy);
        if (std::memcmp(dst.data(), sources[t].data(), bytes) != 0) ++wrong[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) CHECK(wrong[t] == 0);
}

TEST_CASE("a forked child copies on its own thread and gets every byte", "[copy_pool]") {
  const std::size_t bytes = std::size_t{4} << 20;
  const auto src = pattern(bytes, 3);
  std::vector<std::byte> dst(bytes);
  parallel_copy(dst.data(), src.data(), bytes, plain_copy);  // the parent's helpers are up
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::vector<std::byte> out(bytes);
    parallel_copy(out.data(), src.data(), bytes, plain_copy);
    _exit(std::memcmp(out.data(), src.data(), bytes) == 0 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::memset(dst.data(), 0, bytes);
  parallel_copy(dst.data(), src.data(), bytes, plain_copy);
  CHECK(std::memcmp(dst.data(), src.data(), bytes) == 0);
}

}  // namespace mpsshim::shim

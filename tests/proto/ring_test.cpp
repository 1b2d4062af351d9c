// The SPSC ring: wrap padding, full and empty, hostile sizes, and a real two-process stress
// over shared memory with both sides sleeping on futexes.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "proto/ring.hpp"

using namespace mpsshim::proto;

namespace {

struct SharedRing {
  explicit SharedRing(std::uint64_t capacity) : capacity(capacity) {
    bytes = ring_footprint(capacity);
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(memory != MAP_FAILED);
    ctl = ring_init(memory, capacity);
  }
  ~SharedRing() { munmap(memory, bytes); }
  std::uint64_t capacity;
  std::size_t bytes;
  void* memory;
  RingControl* ctl;
};

void write_record(std::byte* at, std::uint32_t bytes, std::uint16_t opcode, std::uint32_t value) {
  RecordHeader h{bytes, opcode, 0, kNoReply, 0};
  std::memcpy(at, &h, sizeof h);
  std::memcpy(at + sizeof h, &value, sizeof value);
}

std::uint32_t value_of(std::span<const std::byte> record) {
  std::uint32_t v;
  std::memcpy(&v, record.data() + sizeof(RecordHeader), sizeof v);
  return v;
}

}  // namespace

TEST_CASE("records come out in order, across the wrap, with padding skipped", "[ring]") {
  SharedRing ring(256);
  RingProducer producer(ring.ctl, ring.capacity);
  RingConsumer sut(ring.ctl, ring.capacity);
  std::uint32_t next = 0, expected = 0;
  for (int round = 0; round < 100; ++round) {
    std::uint32_t bytes = record_bytes(4 + (round % 3) * 16);  // 32, 48, 64
    std::byte* at = producer.try_reserve(bytes);
    if (at == nullptr) {
      // Full: drain everything, then the reservation fits.
      for (Peeked p = sut.peek(); p.status == PeekStatus::kRecord; p = sut.peek()) {
        REQUIRE(value_of(p.record) == expected++);
        sut.release();
      }
      at = producer.try_reserve(bytes);
    }
    REQUIRE(at != nullptr);
    write_record(at, bytes, 7, next++);
    producer.commit();
  }
  for (Peeked p = sut.peek(); p.status == PeekStatus::kRecord; p = sut.peek()) {
    REQUIRE(value_of(p.record) == expected++);
    sut.release();
  }
  CHECK(expected == next);
  CHECK(sut.peek().status == PeekStatus::kEmpty);
}

TEST_CASE("a full ring refuses a reservation instead of overwriting", "[ring]") {
  SharedRing ring(128);
  RingProducer sut(ring.ctl, ring.capacity);
  REQUIRE(sut.try_reserve(64) != nullptr);
  REQUIRE(sut.try_reserve(64) != nullptr);
  CHECK(sut.try_reserve(16) == nullptr);
}

TEST_CASE("hostile record sizes are reported as malformed, never followed", "[ring]") {
  SharedRing ring(256);
  RingConsumer sut(ring.ctl, ring.capacity);
  auto* data = reinterpret_cast<std::byte*>(ring.ctl) + sizeof(RingControl);
  auto publish = [&](RecordHeader h, std::uint64_t head) {
    std::memcpy(data, &h, sizeof h);
    ring.ctl->head.store(head);
  };
  SECTION("larger than what was published") {
    publish({64, 5, 0, kNoReply, 0}, 32);
    CHECK(sut.peek().status == PeekStatus::kMalformed);
  }
  SECTION("not a multiple of the alignment") {
    publish({24, 5, 0, kNoReply, 0}, 32);
    CHECK(sut.peek().status == PeekStatus::kMalformed);
  }
  SECTION("smaller than a header") {
    publish({0, 5, 0, kNoReply, 0}, 32);
    CHECK(sut.peek().status == PeekStatus::kMalformed);
  }
  SECTION("padding that does not end at the buffer's end") {
    publish({32, kPadOpcode, 0, kNoReply, 0}, 64);
    CHECK(sut.peek().status == PeekStatus::kMalformed);
  }
  SECTION("a head further than the capacity") {
    publish({32, 5, 0, kNoReply, 0}, 100000);
    CHECK(sut.peek().status == PeekStatus::kMalformed);
  }
}

TEST_CASE("two processes pass a million records through a small ring", "[ring][fork]") {
  constexpr std::uint32_t kRecords = 1'000'000;
  SharedRing ring(4096);  // small, so both sides wrap, fill and sleep often
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    RingConsumer consumer(ring.ctl, ring.capacity);
    std::uint32_t expected = 0;
    std::uint64_t checksum = 0;
    while (expected < kRecords) {
      Peeked p = consumer.peek();
      if (p.status == PeekStatus::kMalformed) _exit(2);
      if (p.status == PeekStatus::kEmpty) {
        consumer.sleep_on_head(10'000'000);
        continue;
      }
      RecordHeader h;
      std::memcpy(&h, p.record.data(), sizeof h);
      std::uint32_t v = value_of(p.record);
      if (v != expected || h.opcode != 1 + v % 7 || h.size != record_bytes(4 + (v % 13) * 8))
        _exit(3);
      // The payload after the value repeats it: check every byte made it.
      for (std::size_t i = sizeof h + 4; i + 4 <= h.size; i += 4) {
        std::uint32_t w;
        std::memcpy(&w, p.record.data() + i, 4);
        if (w != v) _exit(4);
      }
      checksum += v;
      ++expected;
      if (consumer.release()) consumer.wake_producer();
    }
    _exit(checksum == std::uint64_t{kRecords} * (kRecords - 1) / 2 ? 0 : 5);
  }
  RingProducer producer(ring.ctl, ring.capacity);
  for (std::uint32_t v = 0; v < kRecords; ++v) {
    std::uint32_t bytes = record_bytes(4 + (v % 13) * 8);
    std::byte* at = producer.reserve(bytes, [] { return false; });
    REQUIRE(at != nullptr);
    write_record(at, bytes, static_cast<std::uint16_t>(1 + v % 7), v);
    for (std::size_t i = sizeof(RecordHeader) + 4; i + 4 <= bytes; i += 4)
      std::memcpy(at + i, &v, 4);
    if (producer.commit()) futex_wake(low_word(ring.ctl->head));
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a sleeping consumer is woken by every commit, a dozing one only by awaited ones",
          "[ring]") {
  SharedRing ring(256);
  RingProducer producer(ring.ctl, ring.capacity);
  RingConsumer sut(ring.ctl, ring.capacity);
  auto commit_one = [&](bool awaited) {
    std::byte* at = producer.try_reserve(record_bytes(4));
    REQUIRE(at != nullptr);
    write_record(at, record_bytes(4), 7, 1);
    return producer.commit(awaited);
  };
  CHECK_FALSE(commit_one(true));  // awake: nobody to wake
  sut.prepare_sleep();
  CHECK(commit_one(false));
  CHECK(commit_one(true));
  sut.prepare_doze();
  CHECK_FALSE(commit_one(false));  // collected when the doze ends
  CHECK(commit_one(true));
  sut.end_sleep();
  CHECK_FALSE(commit_one(true));
  int records = 0;
  for (Peeked p = sut.peek(); p.status == PeekStatus::kRecord; p = sut.peek()) {
    ++records;
    sut.release();
  }
  CHECK(records == 6);
}

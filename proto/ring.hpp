// Single-producer single-consumer byte ring in shared memory, carrying variable-size records.
//
// Positions are 64-bit and monotonic (never wrap in practice), so full/empty need no extra bit:
// used = head - tail. Capacity is a power of two; a record never straddles the end of the
// buffer: when it would, the producer writes a padding record up to the end and starts at 0.
// The producer publishes with a release-store of head after writing the record; the consumer
// frees space with a release-store of tail. Each side caches the other's index privately and
// reloads it only when the cached value says "full" (or "empty").
//
// Waiting is spin-then-sleep with a waiter-present flag (io_uring's NEED_WAKEUP): a side that
// wants to sleep sets its flag, fences, re-checks, then sleeps; the other side, after
// publishing, fences and looks at the flag, and wakes only if it is set. The fast path
// therefore makes no system call.
#pragma once

#include <time.h>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "proto/abi.hpp"
#include "proto/futex.hpp"

namespace mpsshim::proto {

inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::uint32_t kRecordAlign = 16;

// Every record starts with this header. size counts the header and is a multiple of
// kRecordAlign. opcode 0 is the padding record written at the wrap.
struct RecordHeader {
  std::uint32_t size;
  std::uint16_t opcode;
  std::uint16_t flags;
  std::uint32_t reply_slot;  // kNoReply for one-way records
  std::uint32_t send_stamp;  // when the producer committed it (below); 0: not stamped (ABI < 1.2)
};
static_assert(sizeof(RecordHeader) == 16);
static_assert(offsetof(RecordHeader, send_stamp) == 12);
static_assert(kWireSafe<RecordHeader>);
inline constexpr std::uint16_t kPadOpcode = 0;
inline constexpr std::uint32_t kNoReply = 0xffffffffu;

// RecordHeader::send_stamp: CLOCK_MONOTONIC nanoseconds >> kSendStampShift (32-ns units), the
// low 32 bits, so it wraps every 2^37 ns (~137 s); a stamp that comes out 0 is sent as 1. The
// consumer reads the record's time in the ring as send_stamp_age_ns(), which is right for any
// wait shorter than the wrap. Both processes read the same clock: they share the host.
inline constexpr unsigned kSendStampShift = 5;

inline std::uint32_t send_stamp_of(std::uint64_t monotonic_ns) {
  auto stamp = static_cast<std::uint32_t>(monotonic_ns >> kSendStampShift);
  return stamp == 0 ? 1 : stamp;
}

// One clock_gettime through the vDSO: no system call.
inline std::uint32_t send_stamp_now() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return send_stamp_of(static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000u +
                       static_cast<std::uint64_t>(now.tv_nsec));
}

// Nanoseconds from `stamp` to `monotonic_ns` (modulo the wrap), in whole 32-ns units.
inline std::uint64_t send_stamp_age_ns(std::uint32_t stamp, std::uint64_t monotonic_ns) {
  auto units = static_cast<std::uint32_t>(monotonic_ns >> kSendStampShift) - stamp;
  return static_cast<std::uint64_t>(units) << kSendStampShift;
}

// Stamps the record whose header starts at `record`: called just before the commit that
// publishes it, once the payload is written.
inline void stamp_record(std::byte* record) {
  const std::uint32_t stamp = send_stamp_now();
  std::memcpy(record + offsetof(RecordHeader, send_stamp), &stamp, sizeof stamp);
}

// The shared indices. head and tail live on separate cache lines so the producer's stores do
// not invalidate the line the consumer polls, and vice versa.
struct RingControl {
  alignas(kCacheLine) std::atomic<std::uint64_t> head;  // written by the producer only
  alignas(kCacheLine) std::atomic<std::uint64_t> tail;  // written by the consumer only
  // Set by the consumer (the server's worker) before it sleeps and cleared when it wakes; a
  // producer that sees it set clears it and rings the consumer's doorbell (ABI 1.29; before, it
  // rang on every record until the consumer was up). kConsumerDozing (ABI 1.30): the consumer
  // naps briefly and collects records meanwhile; a producer rings only when it is about to wait
  // for the consumer (an answer, a copy's chunk, ring space). Producers before 1.30 ring on any
  // value but 0.
  alignas(kCacheLine) std::atomic<std::uint32_t> consumer_waiting;
  std::atomic<std::uint32_t> producer_waiting;
  std::uint64_t capacity;  // bytes of the data area that follows; power of two
};
static_assert(offsetof(RingControl, head) == 0);
static_assert(offsetof(RingControl, tail) == kCacheLine, "tail must not share head's line");
static_assert(offsetof(RingControl, consumer_waiting) == 2 * kCacheLine);
static_assert(offsetof(RingControl, producer_waiting) == 2 * kCacheLine + 4);
static_assert(offsetof(RingControl, capacity) == 2 * kCacheLine + 8);
static_assert(sizeof(RingControl) == 3 * kCacheLine);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// RingControl::consumer_waiting.
inline constexpr std::uint32_t kConsumerAwake = 0;
inline constexpr std::uint32_t kConsumerAsleep = 1;
inline constexpr std::uint32_t kConsumerDozing = 2;

constexpr std::uint32_t record_bytes(std::size_t payload) {
  return static_cast<std::uint32_t>((sizeof(RecordHeader) + payload + kRecordAlign - 1) &
                                    ~std::size_t{kRecordAlign - 1});
}

constexpr bool is_power_of_two(std::uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

// Bytes a ring of `capacity` data bytes needs in the segment.
constexpr std::size_t ring_footprint(std::uint64_t capacity) {
  return sizeof(RingControl) + capacity;
}

// Initializes a ring in zeroed shared memory. Done once by the segment's creator.
inline RingControl* ring_init(void* at, std::uint64_t capacity) {
  auto* ctl = new (at) RingControl{};
  ctl->head.store(0, std::memory_order_relaxed);
  ctl->tail.store(0, std::memory_order_relaxed);
  ctl->consumer_waiting.store(0, std::memory_order_relaxed);
  ctl->producer_waiting.store(0, std::memory_order_relaxed);
  ctl->capacity = capacity;
  return ctl;
}

class RingProducer {
 public:
  RingProducer() = default;
  // capacity is passed by the trusted side, never read back from shared memory.
  RingProducer(RingControl* ctl, std::uint64_t capacity)
      : ctl_(ctl),
        data_(reinterpret_cast<std::byte*>(ctl) + sizeof(RingControl)),
        capacity_(capacity),
        head_(ctl->head.load(std::memory_order_relaxed)),
        cached_tail_(ctl->tail.load(std::memory_order_acquire)) {}

  // The largest record this ring accepts: a quarter of it, so one record never waits on the
  // whole ring draining.
  std::uint32_t max_record() const { return static_cast<std::uint32_t>(capacity_ / 4); }

  // Space for a record of `bytes` (a record_bytes() value) or nullptr when the ring is full.
  // Several reservations may be made before one commit(); they become visible together.
  std::byte* try_reserve(std::uint32_t bytes) {
    std::uint64_t offset = head_ & (capacity_ - 1);
    std::uint64_t pad = (offset + bytes > capacity_) ? capacity_ - offset : 0;
    std::uint64_t need = pad + bytes;
    if (capacity_ - (head_ - cached_tail_) < need) {
      cached_tail_ = ctl_->tail.load(std::memory_order_acquire);
      if (capacity_ - (head_ - cached_tail_) < need) return nullptr;
    }
    if (pad != 0) {
      RecordHeader padding{static_cast<std::uint32_t>(pad), kPadOpcode, 0, kNoReply, 0};
      std::memcpy(data_ + offset, &padding, sizeof padding);
      head_ += pad;
      offset = 0;
    }
    std::byte* at = data_ + offset;
    head_ += bytes;
    return at;
  }

  // Spins, then sleeps on the tail futex until `bytes` fit. Returns nullptr if `give_up`
  // becomes true while waiting (the peer died).
  template <typename GiveUp>
  std::byte* reserve(std::uint32_t bytes, GiveUp&& give_up) {
    for (int spin = 0;; ++spin) {
      if (std::byte* at = try_reserve(bytes)) return at;
      if (give_up()) return nullptr;
      if (spin < 4096) {
        cpu_relax();
        continue;
      }
      ctl_->producer_waiting.store(1, std::memory_order_seq_cst);
      std::uint64_t tail = ctl_->tail.load(std::memory_order_seq_cst);
      if (capacity_ - (head_ - tail) >= bytes + capacity_ / 4) continue;
      futex_wait(low_word(ctl_->tail), static_cast<std::uint32_t>(tail), 1'000'000);
    }
  }

  // Publishes everything reserved so far. Returns true if the consumer must be woken by the
  // caller (futex on head, or the consumer's doorbell): it sleeps, or it dozes and `awaited`
  // (the caller is about to wait for the consumer's answer).
  bool commit(bool awaited = true) {
    ctl_->head.store(head_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t waiting = ctl_->consumer_waiting.load(std::memory_order_relaxed);
    return waiting == kConsumerAsleep || (waiting == kConsumerDozing && awaited);
  }

  std::uint64_t position() const { return head_; }

 private:
  RingControl* ctl_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::uint64_t head_ = 0;
  std::uint64_t cached_tail_ = 0;
};

// What the consumer found at the front of the ring.
enum class PeekStatus { kEmpty, kRecord, kMalformed };

struct Peeked {
  PeekStatus status;
  std::span<const std::byte> record;  // header included; valid until release()
};

class RingConsumer {
 public:
  RingConsumer() = default;
  RingConsumer(RingControl* ctl, std::uint64_t capacity)
      : ctl_(ctl),
        data_(reinterpret_cast<const std::byte*>(ctl) + sizeof(RingControl)),
        capacity_(capacity),
        tail_(ctl->tail.load(std::memory_order_relaxed)),
        cached_head_(ctl->head.load(std::memory_order_acquire)) {}

  // The next record, skipping padding. The producer may be hostile: every size is checked
  // against what was published and against the end of the buffer, and a record that fails is
  // reported as kMalformed (the caller ends the session; the ring is not trusted again).
  // The bytes stay in shared memory: a caller that validates fields must copy them first.
  Peeked peek() {
    for (;;) {
      if (cached_head_ == tail_) {
        cached_head_ = ctl_->head.load(std::memory_order_acquire);
        if (cached_head_ == tail_) return {PeekStatus::kEmpty, {}};
      }
      std::uint64_t available = cached_head_ - tail_;
      if (available > capacity_) return {PeekStatus::kMalformed, {}};
      std::uint64_t offset = tail_ & (capacity_ - 1);
      if (available < sizeof(RecordHeader) || capacity_ - offset < sizeof(RecordHeader)) {
        return {PeekStatus::kMalformed, {}};
      }
      RecordHeader header;
      std::memcpy(&header, data_ + offset, sizeof header);
      if (header.size < sizeof(RecordHeader) || header.size % kRecordAlign != 0 ||
          header.size > available || header.size > capacity_ - offset) {
        return {PeekStatus::kMalformed, {}};
      }
      if (header.opcode == kPadOpcode) {
        if (offset + header.size != capacity_) return {PeekStatus::kMalformed, {}};
        tail_ += header.size;
        continue;
      }
      current_ = header.size;
      return {PeekStatus::kRecord, {data_ + offset, header.size}};
    }
  }

  // Frees the record returned by the last peek() (and any padding before it). Returns true if
  // the producer waits for space (the caller may wake it with wake_producer()).
  bool release() {
    tail_ += current_;
    current_ = 0;
    ctl_->tail.store(tail_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return ctl_->producer_waiting.load(std::memory_order_relaxed) != 0;
  }

  void wake_producer() {
    ctl_->producer_waiting.store(0, std::memory_order_relaxed);
    futex_wake(low_word(ctl_->tail));
  }

  // Announces that the consumer is about to sleep. After this, re-check with peek() before
  // sleeping: a record committed before the flag was visible does not ring the doorbell.
  void prepare_sleep() { ctl_->consumer_waiting.store(kConsumerAsleep, std::memory_order_seq_cst); }
  // The same for a doze: only records whose producers then wait ring the doorbell; the re-check
  // after it finds the rest when the doze ends.
  void prepare_doze() { ctl_->consumer_waiting.store(kConsumerDozing, std::memory_order_seq_cst); }
  void end_sleep() { ctl_->consumer_waiting.store(kConsumerAwake, std::memory_order_relaxed); }

  // Futex-based sleep for consumers that wait on this ring alone (tests, tools).
  void sleep_on_head(std::uint64_t timeout_ns) {
    prepare_sleep();
    std::uint64_t head = ctl_->head.load(std::memory_order_seq_cst);
    if (head == tail_)
      futex_wait(low_word(ctl_->head), static_cast<std::uint32_t>(head), timeout_ns);
    end_sleep();
  }

  std::uint64_t position() const { return tail_; }

 private:
  RingControl* ctl_ = nullptr;
  const std::byte* data_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::uint64_t tail_ = 0;
  std::uint64_t cached_head_ = 0;
  std::uint64_t current_ = 0;
};

}  // namespace mpsshim::proto

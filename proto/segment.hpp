// The shared segment of one session: a sealed memfd created by the server, mapped by both.
//
//   [SegmentHeader][SessionControl][request ring: RingControl + data]
//   [ResponseSlot x slot_count][ChunkState x chunk_count]
//   [HostCallbackControl][HostCallbackCell x callback_cell_count]  (page-aligned, whole pages)
//   [staging chunks]
//
// The server writes the header once before sealing and never reads shared fields back for
// its own decisions: it keeps its own copy of the geometry. Everything the client writes is
// treated as hostile.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "proto/abi.hpp"
#include "proto/ring.hpp"

namespace mpsshim::proto {

inline constexpr std::uint32_t kSegmentMagic = 0x4d475353;  // "SSGM"

struct SegmentHeader {
  std::uint32_t magic;
  std::uint16_t abi_major;
  std::uint16_t abi_minor;
  std::uint64_t segment_bytes;
  std::uint64_t control_offset;
  std::uint64_t ring_offset;
  std::uint64_t ring_capacity;
  std::uint64_t slots_offset;
  std::uint32_t slot_count;
  std::uint32_t slot_bytes;
  std::uint64_t chunk_states_offset;
  std::uint64_t staging_offset;
  std::uint32_t chunk_count;
  std::uint32_t callback_cell_count;  // ABI 1.1; 0 from a 1.0 server: no host functions
  std::uint64_t chunk_bytes;
  std::uint64_t callbacks_offset;  // ABI 1.1: page-aligned, so the server can map it on its own
  std::uint64_t reserved[3];
};
static_assert(kWireSafe<SegmentHeader>);
static_assert(sizeof(SegmentHeader) == 120);
static_assert(offsetof(SegmentHeader, callback_cell_count) == 76);
static_assert(offsetof(SegmentHeader, callbacks_offset) == 88);

// SessionControl::crowded: more clients than the server lets spin; more than it has CPUs too.
inline constexpr std::uint32_t kCrowded = 1;
inline constexpr std::uint32_t kCrowdedPastCpus = 2;

// Session-wide state the server publishes.
struct SessionControl {
  // A sticky failure of the whole server (GPU fault, server exit): every later call of the
  // client returns it. 0 while healthy.
  alignas(kCacheLine) std::atomic<std::uint32_t> fault;
  // First error raised by a one-way call since the client last looked. The client swaps it to
  // 0 at its next synchronizing call and returns it, as CUDA reports asynchronous errors.
  std::atomic<std::uint32_t> async_error;
  std::atomic<std::uint64_t> records_executed;  // accounting, for tests and mpsshimctl
  // ABI 1.12 (was padding, 0): kCrowded while the server has more clients than it lets spin
  // (mpsshim-server --spin-clients): a client thread waiting for an answer then sleeps after
  // a short spin instead of yielding a CPU that the server's workers need
  // (libshim/wait_policy.hpp). 0 from an older server: the client's own plan. ABI 1.31:
  // kCrowdedPastCpus while it also has more clients than CPUs to run on, where a wait is never
  // paced (an older server says kCrowded then).
  std::atomic<std::uint32_t> crowded;
  // ABI 1.19 (was padding, 0): the client whose work first returned the sticky fault, written
  // before `fault` (which publishes them): its pid and program name (NUL-terminated), for the
  // error line every client of the server logs. 0 and "" when unknown or from an older server.
  std::uint32_t fault_pid;
  char fault_program[32];
};
static_assert(sizeof(SessionControl) == kCacheLine);
static_assert(offsetof(SessionControl, async_error) == 4);
static_assert(offsetof(SessionControl, crowded) == 16);
static_assert(offsetof(SessionControl, fault_pid) == 20);
static_assert(offsetof(SessionControl, fault_program) == 24);

enum SlotState : std::uint32_t { kSlotIdle = 0, kSlotPending = 1, kSlotReady = 2 };

// One reply mailbox. A client thread owns a slot from the request to the reply; the server
// writes result and payload, then stores kSlotReady (release) and wakes the futex if a waiter
// is present.
inline constexpr std::uint32_t kSlotBytes = 4096;
struct ResponseSlot {
  alignas(kCacheLine) std::atomic<std::uint32_t> state;  // futex word
  std::atomic<std::uint32_t> waiter;
  std::int32_t result;  // CUresult
  std::uint32_t payload_bytes;
  // Diagnostics, 0 unless the server runs with MPSSHIM_SERVER_STAMP_ANSWERS
  // (broker/server/base/answer_stamps.hpp), CLOCK_MONOTONIC ns: when the worker took the request
  // from the ring, knew the answer (a synchronize: saw its fence complete), and wrote this slot;
  // and when it took and issued the session's last kernel launch before the request.
  std::uint64_t stamp_taken_ns;
  std::uint64_t stamp_known_ns;
  std::uint64_t stamp_answered_ns;
  std::uint64_t stamp_launch_taken_ns;
  std::uint64_t stamp_launch_issued_ns;
  // ABI 1.28 (was reserved, 0): the fence watch (fence_watch()): the word of the session's
  // watch page whose landing finishes this call's GPU work, and the value the GPU writes there.
  // A client thread that spins for the answer looks at the word and rings the doorbell when it
  // landed while the worker sleeps, so the worker sleeps through the GPU's work instead of
  // polling it. The client zeroes it when it takes the slot. The server trusts its own copy of
  // the fence. Written by a 1.28 server before it parks its worker; by a 1.29 server as soon as
  // it defers the answer, and only when the answer will be CUDA_SUCCESS without payload once the
  // word lands (unless the session faults): the client may then return at once (an early
  // answer) and leaves the slot out of circulation until the server's answer comes.
  std::atomic<std::uint64_t> watch;
  std::uint8_t payload[kSlotBytes - kCacheLine];
};
static_assert(sizeof(ResponseSlot) == kSlotBytes);
static_assert(offsetof(ResponseSlot, payload) == kCacheLine);
static_assert(offsetof(ResponseSlot, stamp_taken_ns) == 16);
static_assert(offsetof(ResponseSlot, watch) == 56);

// The watch page: one page of 32-bit host-fence words the GPU writes (a sealed memfd the
// client maps read-only). ResponseSlot::watch holds (word + 1) << 32 | value; 0: no watch.
inline constexpr std::uint32_t kWatchPageWords = 1024;
constexpr std::uint64_t fence_watch(std::uint32_t word, std::uint32_t value) {
  return (std::uint64_t{word} + 1) << 32 | value;
}
constexpr bool watch_set(std::uint64_t watch) {
  return (watch >> 32) != 0;
}
constexpr std::uint32_t watch_word(std::uint64_t watch) {
  return static_cast<std::uint32_t>(watch >> 32) - 1;
}
constexpr std::uint32_t watch_value(std::uint64_t watch) {
  return static_cast<std::uint32_t>(watch);
}
inline constexpr std::uint32_t kSlotPayloadBytes = kSlotBytes - kCacheLine;

// Staging chunk i may be refilled by the client once done_generation equals the generation it
// last issued for that chunk. The server stores the generation when the DMA that used the
// chunk has completed.
struct ChunkState {
  alignas(kCacheLine) std::atomic<std::uint32_t> done_generation;  // futex word
  std::atomic<std::uint32_t> waiter;
  std::atomic<std::int32_t> result;  // CUresult of the copy that used it
};
static_assert(sizeof(ChunkState) == kCacheLine);

// Host functions run in the client, in stream order. A server-side host function on the real
// stream (run by the driver's callback thread) takes a free cell, writes callback_id, status and
// flags, then publishes a fresh ticket in `requested` and bumps HostCallbackControl::posted. The
// client's callback thread runs the callback and stores that ticket in `done`; the server's
// host function waits (futex on `done`) for it, so the stream goes on only afterwards. The
// server never reads anything else the client writes here: a client that lies about `done`
// only reorders its own stream.
struct HostCallbackControl {
  alignas(kCacheLine) std::atomic<std::uint32_t> posted;  // futex word of the client's thread
  std::uint32_t cell_count;
};
static_assert(sizeof(HostCallbackControl) == kCacheLine);

inline constexpr std::uint32_t kCallbackKeep = 1u << 0;  // the id stays valid (a graph's node)

struct HostCallbackCell {
  alignas(kCacheLine) std::atomic<std::uint32_t> requested;  // server: ticket, 0 = never used
  std::atomic<std::uint32_t> done;  // client: the ticket it finished (futex word of the server)
  std::uint32_t flags;              // kCallbackKeep
  std::int32_t status;              // CUresult passed to a stream callback
  std::uint64_t callback_id;
};
static_assert(sizeof(HostCallbackCell) == kCacheLine);
static_assert(offsetof(HostCallbackCell, done) == 4);
static_assert(offsetof(HostCallbackCell, callback_id) == 16);

struct SegmentGeometry {
  std::uint64_t ring_capacity = 1u << 20;
  std::uint32_t slot_count = 64;
  std::uint32_t chunk_count = 16;
  std::uint64_t chunk_bytes = 2u << 20;
  std::uint32_t callback_cells = 63;  // with the control line: one page
};

inline constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
  return (v + to - 1) / to * to;
}
constexpr std::uint64_t callback_region_bytes(std::uint32_t cells) {
  return round_up(sizeof(HostCallbackControl) + std::uint64_t{cells} * sizeof(HostCallbackCell),
                  kPage);
}
inline constexpr std::uint32_t kMaxCallbackCells = 1023;

// Lays the segment out; the staging area is page-aligned so it can be registered for DMA.
constexpr SegmentHeader plan_segment(const SegmentGeometry& g) {
  SegmentHeader h{};
  h.magic = kSegmentMagic;
  h.abi_major = kAbiMajor;
  h.abi_minor = kAbiMinor;
  std::uint64_t at = round_up(sizeof(SegmentHeader), kCacheLine);
  h.control_offset = at;
  at += sizeof(SessionControl);
  h.ring_offset = round_up(at, kCacheLine);
  h.ring_capacity = g.ring_capacity;
  at = h.ring_offset + ring_footprint(g.ring_capacity);
  h.slots_offset = round_up(at, kCacheLine);
  h.slot_count = g.slot_count;
  h.slot_bytes = kSlotBytes;
  at = h.slots_offset + std::uint64_t{g.slot_count} * kSlotBytes;
  h.chunk_states_offset = round_up(at, kCacheLine);
  h.chunk_count = g.chunk_count;
  at = h.chunk_states_offset + std::uint64_t{g.chunk_count} * sizeof(ChunkState);
  h.callbacks_offset = round_up(at, kPage);
  h.callback_cell_count = g.callback_cells;
  at = h.callbacks_offset + callback_region_bytes(g.callback_cells);
  h.staging_offset = round_up(at, kPage);
  h.chunk_bytes = g.chunk_bytes;
  h.segment_bytes =
      round_up(h.staging_offset + std::uint64_t{g.chunk_count} * g.chunk_bytes, kPage);
  return h;
}

// Typed views over a mapped segment, built from a header the viewer trusts.
struct SegmentView {
  std::byte* base = nullptr;
  SegmentHeader geometry{};

  SessionControl* control() const {
    return reinterpret_cast<SessionControl*>(base + geometry.control_offset);
  }
  RingControl* ring() const { return reinterpret_cast<RingControl*>(base + geometry.ring_offset); }
  ResponseSlot* slot(std::uint32_t i) const {
    return reinterpret_cast<ResponseSlot*>(base + geometry.slots_offset) + i;
  }
  ChunkState* chunk_state(std::uint32_t i) const {
    return reinterpret_cast<ChunkState*>(base + geometry.chunk_states_offset) + i;
  }
  HostCallbackControl* callback_control() const {
    return reinterpret_cast<HostCallbackControl*>(base + geometry.callbacks_offset);
  }
  HostCallbackCell* callback_cell(std::uint32_t i) const {
    return reinterpret_cast<HostCallbackCell*>(base + geometry.callbacks_offset +
                                               sizeof(HostCallbackControl)) +
           i;
  }
  std::byte* chunk(std::uint32_t i) const {
    return base + geometry.staging_offset + std::uint64_t{i} * geometry.chunk_bytes;
  }
};

// A header received from the server is checked before the client uses it: everything must
// lie inside the mapping.
constexpr bool segment_header_valid(const SegmentHeader& h, std::uint64_t mapped_bytes) {
  auto inside = [&](std::uint64_t off, std::uint64_t len) {
    return off <= mapped_bytes && len <= mapped_bytes - off;
  };
  return h.magic == kSegmentMagic && h.abi_major == kAbiMajor && h.segment_bytes == mapped_bytes &&
         is_power_of_two(h.ring_capacity) && h.slot_bytes == kSlotBytes && h.slot_count > 0 &&
         h.chunk_count > 0 && h.chunk_count <= 1024 &&
         inside(h.control_offset, sizeof(SessionControl)) &&
         inside(h.ring_offset, ring_footprint(h.ring_capacity)) &&
         inside(h.slots_offset, std::uint64_t{h.slot_count} * kSlotBytes) &&
         inside(h.chunk_states_offset, std::uint64_t{h.chunk_count} * sizeof(ChunkState)) &&
         inside(h.staging_offset, std::uint64_t{h.chunk_count} * h.chunk_bytes) &&
         (h.callback_cell_count == 0 ||
          (h.callback_cell_count <= kMaxCallbackCells && h.callbacks_offset % kPage == 0 &&
           inside(h.callbacks_offset, callback_region_bytes(h.callback_cell_count))));
}

}  // namespace mpsshim::proto

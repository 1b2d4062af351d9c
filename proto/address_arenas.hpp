// One device address space across the GPUs' servers. Each GPU's server places every device
// address it hands out (cuMemAlloc, pitch, VMM reservations) inside its GPU's arena, a fixed
// range of virtual addresses that no other server uses. Every server reserves the whole window
// from its driver (its own arena to allocate from, the others' to map peers' memory at their own
// addresses), and every client reserves it PROT_NONE at start, so no host address of a client
// ever equals a device address either.
//
// Why fixed addresses and not whatever the driver picks: two processes of the real driver hand
// out the same addresses (H200, driver 580: cuMemAllocAsync 0x420000000 and a 16 GiB reservation
// at 0x4a20000000 in both), so two servers collide unless they place their memory themselves.
// The same driver honoured a 512 GiB reservation at 0x600000000000 in one process and at
// 0x608000000000 in another, and 4.5 TiB more of reservations in each; the whole 16 TiB window
// at 0x600000000000 was honoured too (docs/architecture.md, "One device address space"). An arena
// of 1 TiB is 7x an H200's memory: room for several clients' VMM reservations (PyTorch's expandable
// segments reserve ~1.1x the GPU's memory each).
//
// A ThreadSanitizer build has smaller windows of its own (below), sized for the test driver: TSan's
// runtime owns most of the address space, and the windows above lie outside the ranges it lets a
// program map (its mmap turns such a MAP_FIXED_NOREPLACE request into a mapping at address 0 and
// aborts with "mmap at bad address"). Every process of one build (shim, servers, test driver) takes
// the windows from this header, so a TSan build's processes agree with each other, not with a
// plain build's.
#pragma once

#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#define MPSSHIM_TSAN_ADDRESS_WINDOWS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MPSSHIM_TSAN_ADDRESS_WINDOWS 1
#endif
#endif

namespace mpsshim::proto {

inline constexpr unsigned kMaxArenas = 16;  // GPUs of one host

#if !defined(MPSSHIM_TSAN_ADDRESS_WINDOWS)

inline constexpr std::uint64_t kArenaWindowBase = 0x6000'0000'0000;
inline constexpr std::uint64_t kArenaBytes = std::uint64_t{1} << 40;  // 1 TiB per GPU

// Pinned host memory (cuMemHostAlloc) lives in a second window, one slice per GPU's server, at
// an address the server picks and the client maps too: under unified addressing a kernel may be
// handed the host pointer itself (XLA's semaphores, flags written by kernels), so the server's
// mapping, which the GPU sees, must sit at the client's address. A client address the server
// happened to use already would otherwise leave the kernel an address the GPU cannot reach.
// Below where x86-64 Linux loads position-independent executables (0x555555554000, up to 1 TiB
// higher with address randomization) and their brk heap, which a window at 0x500000000000 met,
// and far above the low ranges the driver places its own memory in (measured on an H200:
// 0x420000000, 0x4a20000000).
inline constexpr std::uint64_t kPinnedWindowBase = 0x2000'0000'0000;
inline constexpr std::uint64_t kPinnedSliceBytes = std::uint64_t{1} << 40;  // 1 TiB per GPU

#else

// ThreadSanitizer (GCC 12's libtsan, x86-64) lets a program map only [0x1000, 0x80'0000'0000)
// (512 GiB), [0x5500'0000'0000, 0x5680'0000'0000) (position-independent executables and their
// heap) and [0x7e80'0000'0000, 2^47) (libraries, stacks, the kernel's mmap area); its allocator
// holds [0x7b00'0000'0000, 0x7c00'0000'0000). Measured with MAP_FIXED_NOREPLACE mappings in an
// instrumented program. Its shadow memory fills 0x100'0000'0000 to 0x2000'0000'0000. Both windows
// go in the low range, with 64 GiB left free below them (executables not built as PIE load at
// 0x400000 with their brk heap after them; MAP_32BIT mappings lie below 2 GiB), 32 GiB between
// them and 32 GiB above, under TSan's PROT_NONE guard at 0x80'0000'0000; the kernel's top-down
// mmap area never comes down this far. A 16 GiB arena holds a test driver GPU of the default
// 16 GiB; 8 GiB of pinned memory per GPU's server is far more than a test pins.
inline constexpr std::uint64_t kArenaWindowBase = 0x0038'0000'0000;
inline constexpr std::uint64_t kArenaBytes = std::uint64_t{16} << 30;  // 16 GiB per GPU

inline constexpr std::uint64_t kPinnedWindowBase = 0x0010'0000'0000;
inline constexpr std::uint64_t kPinnedSliceBytes = std::uint64_t{8} << 30;  // 8 GiB per GPU

inline constexpr std::uint64_t kTsanLowRangeEnd = 0x0080'0000'0000;
static_assert(kPinnedWindowBase >= std::uint64_t{64} << 30 &&
                  kArenaWindowBase + kArenaBytes * kMaxArenas <= kTsanLowRangeEnd,
              "both windows inside TSan's low application range, clear of the lowest 64 GiB");

#endif

inline constexpr std::uint64_t kArenaWindowBytes = kArenaBytes * kMaxArenas;
inline constexpr std::uint64_t kPinnedWindowBytes = kPinnedSliceBytes * kMaxArenas;

// The arena of the GPU with physical ordinal `gpu` (< kMaxArenas).
constexpr std::uint64_t arena_base(unsigned gpu) {
  return kArenaWindowBase + std::uint64_t{gpu} * kArenaBytes;
}

// The physical ordinal whose arena holds `address`, or -1.
constexpr int arena_holding(std::uint64_t address) {
  if (address < kArenaWindowBase || address - kArenaWindowBase >= kArenaWindowBytes) return -1;
  return static_cast<int>((address - kArenaWindowBase) / kArenaBytes);
}

constexpr std::uint64_t pinned_slice_base(unsigned gpu) {
  return kPinnedWindowBase + std::uint64_t{gpu} * kPinnedSliceBytes;
}

static_assert(kPinnedWindowBase + kPinnedWindowBytes <= kArenaWindowBase,
              "the pinned window lies below the device window");
static_assert(kPinnedWindowBase + kPinnedWindowBytes <= 0x5555'5555'4000,
              "the pinned window lies below executables and their heap");
static_assert(kArenaWindowBase + kArenaWindowBytes <= 0x7000'0000'0000,
              "the window stays well below the top-down mmap area of x86-64 user space");
static_assert(arena_holding(arena_base(3) + 5) == 3 && arena_holding(kArenaWindowBase - 1) == -1);

}  // namespace mpsshim::proto

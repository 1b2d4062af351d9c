// Black-box probe of the real driver and the host: how fast a suspend can get page-locked host
// memory to park a client's device memory in, piece by piece, with each piece's copy queued as
// soon as it is registered (broker/server/driver/parked_memory.cpp). For fresh memory of TOTAL
// GiB in 1 GiB pieces (huge pages asked for), each a schedule:
//   serial    each piece faulted in (16 threads), registered, its copy queued, one after another
//   ahead1    the next piece faulted in while this one is registered (what the server does)
//   ahead2    one thread of its own faulting pieces in up to two ahead of the registering one
//   reg2      as ahead2, with two threads registering alternate pieces
//   vmmhost   the driver's own page-locked memory instead: cuMemCreate on the host (NUMA node 0),
//             mapped and made accessible to the GPU and the CPU, from 1 and 4 threads
// and, apart, registering 4 GiB already faulted in from 1, 2 and 4 threads at once. Each line
// gives the whole time and rate (the copies' end included) and the time spent faulting and
// registering, summed over the pieces.
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -pthread -I/usr/local/cuda/include tools/probes/park_pin_rates.cpp
//     -lcuda -o /tmp/park_pin && /tmp/park_pin [TOTAL_GIB [vmm]]   (vmm: the vmmhost lines alone)
#include <cuda.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr std::uint64_t kPiece = kGiB;
constexpr std::uint64_t kHugePage = std::uint64_t{2} << 20;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::byte* map_huge(std::uint64_t bytes) {
  void* raw = ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    std::printf("mmap of %llu bytes failed\n", static_cast<unsigned long long>(bytes));
    std::exit(1);
  }
  auto aligned = (reinterpret_cast<std::uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1);
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<std::byte*>(aligned);
}

// Touches every page of the piece on `threads` threads.
void fault_in(std::byte* p, std::uint64_t bytes, unsigned threads) {
  const std::uint64_t share = (bytes / threads + kHugePage - 1) & ~(kHugePage - 1);
  std::vector<std::thread> helpers;
  for (unsigned i = 0; i < threads && i * share < bytes; ++i) {
    helpers.emplace_back([p, i, share, bytes] {
      const std::uint64_t end = std::min(bytes, (i + 1) * share);
      for (std::uint64_t o = i * share; o < end; o += 4096) {
        *reinterpret_cast<volatile std::byte*>(p + o) = std::byte{1};
      }
    });
  }
  for (auto& t : helpers) t.join();
}

struct Totals {
  std::atomic<std::uint64_t> fault_ns{0}, register_ns{0};
  void add(std::atomic<std::uint64_t>& to, Clock::time_point since) {
    to += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
  }
};

struct Run {
  CUcontext context;
  CUdeviceptr device;  // kPiece bytes, copied into every piece
  CUstream stream;
  unsigned fault_threads;
};

void register_and_copy(const Run& run, std::byte* piece, Totals& totals, std::mutex& queue) {
  const auto t = Clock::now();
  MUST(cuMemHostRegister(piece, kPiece, 0));
  totals.add(totals.register_ns, t);
  std::lock_guard lock(queue);
  MUST(cuMemcpyDtoHAsync(piece, run.device, kPiece, run.stream));
}

void schedule(const Run& run, const std::string& name, std::uint64_t total) {
  std::byte* base = map_huge(total);
  const std::uint64_t pieces = total / kPiece;
  Totals totals;
  std::mutex queue;
  const auto start = Clock::now();
  auto fault_piece = [&](std::uint64_t i) {
    const auto t = Clock::now();
    fault_in(base + i * kPiece, kPiece, run.fault_threads);
    totals.add(totals.fault_ns, t);
  };
  if (name == "serial") {
    for (std::uint64_t i = 0; i < pieces; ++i) {
      fault_piece(i);
      register_and_copy(run, base + i * kPiece, totals, queue);
    }
  } else if (name == "ahead1") {
    fault_piece(0);
    for (std::uint64_t i = 0; i < pieces; ++i) {
      std::thread ahead;
      if (i + 1 < pieces) ahead = std::thread(fault_piece, i + 1);
      register_and_copy(run, base + i * kPiece, totals, queue);
      if (ahead.joinable()) ahead.join();
    }
  } else {  // ahead2, reg2: a faulting thread up to two pieces ahead of the registering ones
    const unsigned registrars = name == "reg2" ? 2 : 1;
    std::mutex m;
    std::condition_variable cv;
    std::uint64_t faulted = 0, taken = 0, done = 0;
    std::thread faulter([&] {
      for (std::uint64_t i = 0; i < pieces; ++i) {
        {
          std::unique_lock lock(m);
          cv.wait(lock, [&] { return i < done + 2 + registrars - 1; });
        }
        fault_piece(i);
        {
          std::lock_guard lock(m);
          faulted = i + 1;
        }
        cv.notify_all();
      }
    });
    std::vector<std::thread> workers;
    for (unsigned r = 0; r < registrars; ++r) {
      workers.emplace_back([&] {
        MUST(cuCtxSetCurrent(run.context));
        for (;;) {
          std::uint64_t i;
          {
            std::unique_lock lock(m);
            cv.wait(lock, [&] { return taken >= pieces || taken < faulted; });
            if (taken >= pieces) return;
            i = taken++;
          }
          register_and_copy(run, base + i * kPiece, totals, queue);
          {
            std::lock_guard lock(m);
            ++done;
          }
          cv.notify_all();
        }
      });
    }
    for (auto& w : workers) w.join();
    faulter.join();
  }
  MUST(cuStreamSynchronize(run.stream));
  const double s = seconds_since(start);
  std::printf(
      "%-8s %3llu GiB, fault threads %2u: %.3f s, %.1f GB/s (faulting %.3f s, "
      "registering %.3f s, summed over pieces)\n",
      name.c_str(), static_cast<unsigned long long>(total / kGiB), run.fault_threads, s,
      total / s / 1e9, totals.fault_ns / 1e9, totals.register_ns / 1e9);
  for (std::uint64_t i = 0; i < pieces; ++i) MUST(cuMemHostUnregister(base + i * kPiece));
  ::munmap(base, total);
}

// Page-locked memory the driver allocates itself (cuMemCreate, location host NUMA node 0), one
// piece at a time on each of `threads` threads, each piece's copy queued once it is mapped.
void vmm_host(const Run& run, std::uint64_t total, unsigned threads) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  CUmemAccessDesc access[2]{};
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = 0;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  access[1].location.id = 0;
  access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const std::uint64_t pieces = total / kPiece;
  CUdeviceptr base;
  MUST(cuMemAddressReserve(&base, total, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles(pieces);
  std::mutex queue;
  std::atomic<std::uint64_t> next{0}, create_ns{0};
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      MUST(cuCtxSetCurrent(run.context));
      for (std::uint64_t i; (i = next++) < pieces;) {
        const auto t0 = Clock::now();
        const CUdeviceptr at = base + i * kPiece;
        MUST(cuMemCreate(&handles[i], kPiece, &prop, 0));
        MUST(cuMemMap(at, kPiece, 0, handles[i], 0));
        MUST(cuMemSetAccess(at, kPiece, access, 2));
        create_ns +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
        std::lock_guard lock(queue);
        MUST(cuMemcpyAsync(at, run.device, kPiece, run.stream));
      }
    });
  }
  for (auto& w : workers) w.join();
  MUST(cuStreamSynchronize(run.stream));
  const double s = seconds_since(start);
  const auto* bytes = reinterpret_cast<const unsigned char*>(base);
  std::printf(
      "vmmhost  %3llu GiB, %u threads: %.3f s, %.1f GB/s (creating and mapping %.3f s, "
      "summed over pieces; CPU reads back %d)\n",
      static_cast<unsigned long long>(total / kGiB), threads, s, total / s / 1e9, create_ns / 1e9,
      bytes[total - 1]);
  for (std::uint64_t i = 0; i < pieces; ++i) {
    MUST(cuMemUnmap(base + i * kPiece, kPiece));
    MUST(cuMemRelease(handles[i]));
  }
  MUST(cuMemAddressFree(base, total));
}

// Registering memory already faulted in, from `threads` threads at once (a piece each).
void parallel_register(const Run& run, unsigned threads) {
  const std::uint64_t total = 4 * kGiB;
  std::byte* base = map_huge(total);
  fault_in(base, total, 16);
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  std::atomic<std::uint64_t> next{0};
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      MUST(cuCtxSetCurrent(run.context));
      for (std::uint64_t i; (i = next++) < total / kPiece;) {
        MUST(cuMemHostRegister(base + i * kPiece, kPiece, 0));
      }
    });
  }
  for (auto& w : workers) w.join();
  const double s = seconds_since(start);
  std::printf("register 4 GiB faulted in, %u threads: %.3f s, %.1f GB/s\n", threads, s,
              total / s / 1e9);
  for (std::uint64_t i = 0; i < total / kPiece; ++i) MUST(cuMemHostUnregister(base + i * kPiece));
  ::munmap(base, total);
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t total = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) * kGiB;
  CUcontext context;
  start_on_gpu0(&context);
  Run run{context, 0, nullptr, 16};
  MUST(cuMemAlloc(&run.device, kPiece));
  MUST(cuMemsetD8(run.device, 7, kPiece));
  MUST(cuStreamCreate(&run.stream, CU_STREAM_NON_BLOCKING));
  const bool vmm_only = argc > 2 && std::string(argv[2]) == "vmm";
  for (int round = 0; round < 2 && !vmm_only; ++round) {
    for (const char* name : {"serial", "ahead1", "ahead2", "reg2"}) schedule(run, name, total);
  }
  if (!vmm_only) {
    run.fault_threads = 8;
    schedule(run, "ahead2", total);
    run.fault_threads = 32;
    schedule(run, "ahead2", total);
    for (unsigned threads : {1u, 2u, 4u}) parallel_register(run, threads);
  }
  for (int round = 0; round < 2; ++round) {
    for (unsigned threads : {1u, 4u}) vmm_host(run, total, threads);
  }
  return 0;
}

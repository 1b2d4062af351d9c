// What the server spent on one client: per opcode, how many records and how long their handlers
// ran (wall time on the server thread, steady_clock around the handler); and how long records
// waited in the ring, from the client's commit (RecordHeader::send_stamp) to the handler's
// start, as a log2 histogram. Shown by `mpsshimctl stats`.
//
// Updated by the thread that owns the session, once per record: no lock, no allocation.
#pragma once

#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/ops.hpp"
#include "proto/ring.hpp"

namespace mpsshim::server {

class Session;

struct SessionStats {
  static constexpr std::size_t kOpCount = static_cast<std::size_t>(proto::Op::kCount);
  // Bucket 0 holds delays under 32 ns (the stamp's resolution); bucket b in 1..27 holds
  // [32 ns * 2^(b-1), 32 ns * 2^b), so bucket 27 ends at ~4.3 s; the last bucket holds the rest
  // (up to the stamp's wrap, ~137 s).
  static constexpr std::size_t kDelayBuckets = 29;
  static constexpr std::size_t kOverflowBucket = kDelayBuckets - 1;
  // The record was not stamped (a client older than ABI 1.2): no delay sample.
  static constexpr std::uint64_t kNotStamped = ~std::uint64_t{0};

  struct PerOp {
    std::uint64_t count = 0;
    std::uint64_t handler_ns = 0;
  };

  std::array<PerOp, kOpCount> ops{};
  std::array<std::uint64_t, kDelayBuckets> delay{};
  // Launch batching (launch_batch.hpp): graph launches that carried a batch, the kernels they
  // carried, the disabled nodes they carried past a batch's end (Graphs::kPadded), executable
  // graphs built, and batches that went out eagerly because a step of the graph path failed.
  std::uint64_t batches = 0;
  std::uint64_t batched = 0;
  std::uint64_t batch_padding = 0;
  // Nodes of a batch's graph that held this launch's function, shape and arguments already and
  // were not updated.
  std::uint64_t batch_nodes_kept = 0;
  std::uint64_t batch_graphs = 0;
  std::uint64_t batch_build_ns = 0;  // making and instantiating those graphs
  std::uint64_t batch_fallbacks = 0;
  // Fence watches (fence_watch.hpp): owed answers the worker left to the waiting client's watch
  // of their fence while it slept, and doorbells the client rang because a watched fence landed.
  std::uint64_t fence_watches = 0;
  std::uint64_t watch_wakes = 0;
  // Dozes of its worker while serving it (idle_strategy.hpp): naps during which its one-way
  // records collected unannounced, to go out together when the nap ended.
  std::uint64_t dozes = 0;
  // Kernel images the session loaded (op_image_load), and their bytes: libraries it shares with
  // other sessions (found in the image cache or published there, image_cache.hpp), and libraries
  // and modules loaded for it alone (variables in them, a module, or sharing off). The driver
  // keeps several bytes of host memory per byte of a loaded image: the private bytes are what
  // this session costs the server's memory beyond what it shares.
  std::uint64_t images_shared = 0;
  std::uint64_t images_shared_bytes = 0;
  std::uint64_t images_private = 0;
  std::uint64_t images_private_bytes = 0;
  // Heap bytes each opcode's handlers added, net (heap_profile.hpp); zeros unless
  // MPSSHIM_SERVER_HEAP_PROFILE is set.
  std::array<std::int64_t, kOpCount> heap_growth{};

  // steady_clock is CLOCK_MONOTONIC (libstdc++ on Linux, through the vDSO), the clock of the
  // client's RecordHeader::send_stamp.
  static std::uint64_t now_ns() {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }
  // How long a record stamped `send_stamp` waited until `now` (a now_ns() value).
  static std::uint64_t delay_ns(std::uint32_t send_stamp, std::uint64_t now) {
    return send_stamp == 0 ? kNotStamped : proto::send_stamp_age_ns(send_stamp, now);
  }

  void record(proto::Op op, std::uint64_t handler_ns, std::uint64_t delay_ns) {
    const auto index = static_cast<std::size_t>(op);
    if (index < kOpCount) {
      ops[index].count += 1;
      ops[index].handler_ns += handler_ns;
    }
    if (delay_ns != kNotStamped) delay[delay_bucket(delay_ns)] += 1;
  }

  static std::size_t delay_bucket(std::uint64_t delay_ns) {
    const std::uint64_t units = delay_ns >> 5;
    const auto width = static_cast<std::size_t>(std::bit_width(units));
    return width < kOverflowBucket ? width : kOverflowBucket;
  }
  // The delays bucket b holds: [lower, upper) nanoseconds.
  static std::uint64_t bucket_lower_ns(std::size_t bucket);
  static std::uint64_t bucket_upper_ns(std::size_t bucket);

  std::uint64_t records() const;
  std::uint64_t handler_ns() const;
  std::uint64_t delay_samples() const;
  // The delay below which a fraction `p` (0..1) of the samples fall, interpolated linearly
  // inside its bucket: within a factor of two of the truth. 0 without samples.
  double delay_percentile_ns(double p) const;
  // The upper edge of the highest bucket with a sample: every delay was below it.
  std::uint64_t delay_max_ns() const;

  struct Top {
    proto::Op op;
    PerOp figures;
  };
  // The `n` opcodes with the most handler time, most first (ties: more records, then opcode).
  std::vector<Top> top(std::size_t n) const;
};

// One line of blank-separated key=value fields, newline-terminated:
//   client=3 pid=4123 uid=1000 program=python3 records=20512 server_us=55123
//   delay_samples=20512 delay_p50_us=0.4 delay_p99_us=3.1 delay_max_us=8.2
//   batches=300 batched=19200
//   top=LaunchKernel:20000:51234,CopyHtoD:12:3100,...
// Delays are "-" without samples; top is "-" before the first record. batches/batched: graph
// launches that carried launch batches and the kernels in them (launch_batch.hpp). Kept short:
// an answer holds one such line per client.
std::string format_session_stats(const Session& session);

}  // namespace mpsshim::server

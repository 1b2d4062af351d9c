// A CUevent: each record captures a generation when enqueued and completes it in stream order; the
// event stands for its latest capture, as cuEventRecord documents.
#pragma once

#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>

namespace mpsshim::testdriver {

class Event {
 public:
  using Clock = std::chrono::steady_clock;

  Event(int device, CUcontext context, unsigned flags)
      : device_(device), context_(context), flags_(flags) {}

  int device() const { return device_; }
  CUcontext context() const { return context_; }
  unsigned flags() const { return flags_; }

  // At enqueue time; the returned generation becomes the event's latest capture.
  std::uint64_t capture();
  // In stream order.
  void complete(std::uint64_t generation);
  // The latest capture, 0 when never recorded.
  std::uint64_t latest() const;
  bool reached(std::uint64_t generation) const;
  void wait(std::uint64_t generation);
  // When the latest capture completed; empty if never recorded or still pending.
  std::optional<Clock::time_point> timestamp() const;

 private:
  const int device_;
  const CUcontext context_;
  const unsigned flags_;
  mutable std::mutex mutex_;
  std::condition_variable completed_;
  std::uint64_t latest_ = 0;
  std::set<std::uint64_t> pending_;
  Clock::time_point stamp_{};
};

}  // namespace mpsshim::testdriver

// One stream's work, run in order on a thread of its own: like a GPU stream it runs concurrently
// with the host and with every other stream, so a caller that forgets to synchronize sees stale
// data here as it would on the device.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace mpsshim::testdriver {

class WorkQueue {
 public:
  using Ticket = std::uint64_t;  // 1 for the first operation submitted, then 2, 3, ...

  // The worker keeps the queue alive until it has been retired and has drained.
  static std::shared_ptr<WorkQueue> start();

  // `then`, if given, runs as the operation comes to count as completed, atomically with it:
  // what it makes visible (an event's completion) and the stream's own state never disagree.
  // It runs under the queue's lock and must not call back into the queue.
  Ticket submit(std::function<void()> op, std::function<void()> then = {});
  void wait(Ticket ticket);
  bool reached(Ticket ticket) const;
  Ticket last_submitted() const;
  void wait_idle() { wait(last_submitted()); }
  // Runs what was submitted, then lets the worker exit; no submissions afterwards.
  void retire();

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable progress_;
  struct Op {
    std::function<void()> run;
    std::function<void()> then;
  };
  std::deque<Op> ops_;
  Ticket submitted_ = 0;
  Ticket completed_ = 0;
  bool retired_ = false;
};

}  // namespace mpsshim::testdriver

#include "tests/testdriver/work_queue.hpp"

#include <thread>
#include <utility>

namespace mpsshim::testdriver {

std::shared_ptr<WorkQueue> WorkQueue::start() {
  auto queue = std::make_shared<WorkQueue>();
  // Detached: cuStreamDestroy returns at once and the stream finishes its work on its own, as the
  // real driver documents; the library is never unloaded (-z nodelete), so the code stays.
  std::thread([queue] { queue->run(); }).detach();
  return queue;
}

WorkQueue::Ticket WorkQueue::submit(std::function<void()> op, std::function<void()> then) {
  std::lock_guard lock(mutex_);
  ops_.push_back(Op{std::move(op), std::move(then)});
  work_.notify_one();
  return ++submitted_;
}

void WorkQueue::wait(Ticket ticket) {
  std::unique_lock lock(mutex_);
  progress_.wait(lock, [&] { return completed_ >= ticket; });
}

bool WorkQueue::reached(Ticket ticket) const {
  std::lock_guard lock(mutex_);
  return completed_ >= ticket;
}

WorkQueue::Ticket WorkQueue::last_submitted() const {
  std::lock_guard lock(mutex_);
  return submitted_;
}

void WorkQueue::retire() {
  std::lock_guard lock(mutex_);
  retired_ = true;
  work_.notify_one();
}

void WorkQueue::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return !ops_.empty() || retired_; });
    if (ops_.empty()) return;
    Op op = std::move(ops_.front());
    ops_.pop_front();
    lock.unlock();
    op.run();
    op.run = nullptr;  // drop what the operation captured before reporting it done
    lock.lock();
    ++completed_;
    // Under the lock, before anyone is woken: whoever sees the stream reach the op finds `then`
    // done, and whoever sees `then`'s effect finds the stream there (it takes this lock).
    if (op.then) {
      op.then();
      op.then = nullptr;
    }
    progress_.notify_all();
  }
}

}  // namespace mpsshim::testdriver

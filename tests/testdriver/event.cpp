#include "tests/testdriver/event.hpp"

namespace mpsshim::testdriver {

std::uint64_t Event::capture() {
  std::lock_guard lock(mutex_);
  pending_.insert(++latest_);
  return latest_;
}

void Event::complete(std::uint64_t generation) {
  std::lock_guard lock(mutex_);
  pending_.erase(generation);
  if (generation == latest_) stamp_ = Clock::now();
  completed_.notify_all();
}

std::uint64_t Event::latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

bool Event::reached(std::uint64_t generation) const {
  std::lock_guard lock(mutex_);
  return !pending_.contains(generation);
}

void Event::wait(std::uint64_t generation) {
  std::unique_lock lock(mutex_);
  completed_.wait(lock, [&] { return !pending_.contains(generation); });
}

std::optional<Event::Clock::time_point> Event::timestamp() const {
  std::lock_guard lock(mutex_);
  if (latest_ == 0 || pending_.contains(latest_)) return std::nullopt;
  return stamp_;
}

}  // namespace mpsshim::testdriver

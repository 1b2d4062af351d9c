#include "broker/daemon/event_loop.hpp"

#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <system_error>

namespace mpsshim::daemon {

namespace {

// epoll data carries the fd and a generation, so an event queued for an fd that was closed and
// reused within the same epoll_wait batch is recognised as stale and dropped.
std::uint64_t pack(int fd, std::uint32_t generation) {
  return (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
}

}  // namespace

EventLoop::EventLoop() : epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (!epoll_) throw std::system_error(errno, std::generic_category(), "epoll_create1");
}

void EventLoop::watch(int fd, std::uint32_t events, Handler handler) {
  std::uint32_t generation = next_generation_++;
  epoll_event event{};
  event.events = events;
  event.data.u64 = pack(fd, generation);
  int op = watches_.contains(fd) ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
  int rc = ::epoll_ctl(epoll_.get(), op, fd, &event);
  if (rc != 0 && op == EPOLL_CTL_MOD && errno == ENOENT) {
    rc = ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event);  // closed without unwatch()
  }
  if (rc != 0) throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  watches_[fd] = Watch{generation, std::make_shared<Handler>(std::move(handler))};
}

void EventLoop::unwatch(int fd) {
  if (watches_.erase(fd) == 0) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

EventLoop::TimerId EventLoop::at(Clock::time_point when, std::function<void()> callback) {
  TimerId id = next_timer_++;
  timers_.emplace(std::pair{when, id}, std::move(callback));
  timer_index_.emplace(id, when);
  return id;
}

void EventLoop::cancel(TimerId id) {
  auto it = timer_index_.find(id);
  if (it == timer_index_.end()) return;
  timers_.erase(std::pair{it->second, id});
  timer_index_.erase(it);
}

int EventLoop::wait_milliseconds() const {
  if (timers_.empty()) return -1;
  auto delay = timers_.begin()->first.first - Clock::now();
  if (delay <= Clock::duration::zero()) return 0;
  // Round up: waking a millisecond early would only spin once more.
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(delay).count();
  return static_cast<int>(std::min<decltype(ms)>(ms, 60'000));
}

void EventLoop::run_due_timers() {
  auto now = Clock::now();
  while (!stopped_ && !timers_.empty() && timers_.begin()->first.first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_index_.erase(node.key().second);
    node.mapped()();
  }
}

void EventLoop::run() {
  std::array<epoll_event, 64> events;
  while (!stopped_) {
    int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                         wait_milliseconds());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "epoll_wait");
    }
    for (int i = 0; i < n && !stopped_; ++i) {
      int fd = static_cast<int>(events[i].data.u64 & 0xffffffffu);
      auto generation = static_cast<std::uint32_t>(events[i].data.u64 >> 32);
      auto it = watches_.find(fd);
      if (it == watches_.end() || it->second.generation != generation) continue;
      std::shared_ptr<Handler> handler = it->second.handler;
      (*handler)(events[i].events);
    }
    run_due_timers();
  }
}

}  // namespace mpsshim::daemon

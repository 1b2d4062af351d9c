// A single-threaded epoll loop with deadlines. Every part of the daemon runs on it, so nothing
// needs a lock and nothing may block: a handler that would wait registers an fd or a timer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

using Clock = std::chrono::steady_clock;

class EventLoop {
 public:
  using Handler = std::function<void(std::uint32_t events)>;
  using TimerId = std::uint64_t;

  EventLoop();  // throws std::system_error if epoll is unavailable
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // `fd` stays owned by the caller, who must unwatch() it before closing it.
  void watch(int fd, std::uint32_t events, Handler handler);
  void unwatch(int fd);

  TimerId at(Clock::time_point when, std::function<void()> callback);
  TimerId after(Clock::duration delay, std::function<void()> callback) {
    return at(Clock::now() + delay, std::move(callback));
  }
  void cancel(TimerId id);  // a timer already fired or cancelled is ignored

  // Runs fd handlers and due timers until stop().
  void run();
  void stop() { stopped_ = true; }

 private:
  struct Watch {
    std::uint32_t generation;
    std::shared_ptr<Handler> handler;  // shared: a handler may unwatch itself while running
  };
  void run_due_timers();
  int wait_milliseconds() const;

  proto::UniqueFd epoll_;
  std::unordered_map<int, Watch> watches_;
  std::uint32_t next_generation_ = 1;
  std::map<std::pair<Clock::time_point, TimerId>, std::function<void()>> timers_;
  std::unordered_map<TimerId, Clock::time_point> timer_index_;
  TimerId next_timer_ = 1;
  bool stopped_ = false;
};

}  // namespace mpsshim::daemon

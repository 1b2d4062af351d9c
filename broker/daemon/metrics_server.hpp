// The HTTP side of `mpsshimd --metrics-listen`: GET /metrics, one request per connection.
//
// Decision: it runs on the daemon's own event loop (event_loop.hpp) with non-blocking sockets,
// not on Boost.Beast/Asio or a thread of its own. The metrics come from the Supervisor and the
// servers' `ps`/`stats` answers, which live on that loop and have no locks; a second thread
// would need them copied across under a lock, and Asio would be a second event loop to run.
// A scrape costs the loop what an `mpsshimctl ps` costs it: a few non-blocking reads and
// writes, and two text requests per running server answered through the same callbacks (each
// server gets Commands::kServerTimeout, 2 s). Nothing here ever blocks:
//   - a connection has kRequestTimeout to send its request head (at most kMaxRequestBytes),
//     else it is closed; one that sends nothing costs an fd for that long and nothing else;
//   - the answer must be taken within kResponseTimeout, else the connection is closed;
//   - at most kMaxConnections are open at once; more are accepted and closed at once, so a
//     flood cannot pile up requests at the servers (each scrape asks every server twice, well
//     under Supervisor::kMaxPendingRequests);
//   - accepting is bounded per wake-up, as on the control socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "broker/daemon/event_loop.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

class MetricsServer {
 public:
  static constexpr auto kRequestTimeout = std::chrono::seconds(5);
  static constexpr auto kResponseTimeout = std::chrono::seconds(10);
  static constexpr std::size_t kMaxRequestBytes = 8192;
  static constexpr std::size_t kMaxConnections = 8;

  // Produces the body of GET /metrics: calls its argument exactly once, possibly later.
  using Collect = std::function<void(std::function<void(std::string body)>)>;

  MetricsServer(EventLoop& loop, Collect collect);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void listen(proto::UniqueFd listener);  // a listening, non-blocking TCP socket
  void close();                           // stop listening and drop every connection

 private:
  struct Connection {
    std::uint64_t id = 0;
    proto::UniqueFd fd;
    std::string in;
    std::string out;
    std::size_t written = 0;
    bool answering = false;  // the request is read; waiting for the body or writing it
    EventLoop::TimerId deadline = 0;
  };

  void accept_all();
  void on_readable(std::uint64_t id);
  void on_request(Connection& connection);
  void respond(Connection& connection, int status, std::string_view reason,
               std::string_view content_type, std::string body, bool head = false,
               std::string_view extra_headers = "");
  void on_writable(std::uint64_t id);
  void drop(std::uint64_t id);

  EventLoop& loop_;
  Collect collect_;
  proto::UniqueFd listener_;
  std::map<std::uint64_t, std::shared_ptr<Connection>> connections_;
  std::uint64_t next_id_ = 1;
};

}  // namespace mpsshim::daemon

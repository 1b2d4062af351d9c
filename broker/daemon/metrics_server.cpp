#include "broker/daemon/metrics_server.hpp"

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "broker/daemon/log.hpp"
#include "broker/daemon/metrics.hpp"

namespace mpsshim::daemon {

namespace {

constexpr std::string_view kTextPlain = "text/plain; charset=utf-8";

}  // namespace

MetricsServer::MetricsServer(EventLoop& loop, Collect collect)
    : loop_(loop), collect_(std::move(collect)) {}

MetricsServer::~MetricsServer() {
  close();
}

void MetricsServer::listen(proto::UniqueFd listener) {
  listener_ = std::move(listener);
  loop_.watch(listener_.get(), EPOLLIN, [this](std::uint32_t) { accept_all(); });
}

void MetricsServer::close() {
  if (listener_) {
    loop_.unwatch(listener_.get());
    listener_.reset();
  }
  for (auto& [id, connection] : connections_) {
    loop_.unwatch(connection->fd.get());
    loop_.cancel(connection->deadline);
  }
  connections_.clear();  // a body still being gathered finds its connection gone
}

void MetricsServer::accept_all() {
  for (int budget = 64; budget > 0 && listener_; --budget) {
    proto::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        log_error("accepting a metrics connection failed: {}", std::strerror(errno));
      }
      return;
    }
    if (connections_.size() >= kMaxConnections) {
      log_debug("metrics connection closed: {} are already open", connections_.size());
      continue;  // closed by fd's destructor
    }
    auto connection = std::make_shared<Connection>();
    const std::uint64_t id = next_id_++;
    connection->id = id;
    connection->fd = std::move(fd);
    connection->deadline = loop_.after(kRequestTimeout, [this, id] {
      log_debug("metrics connection sent no complete request within {} s; closed",
                std::chrono::seconds(kRequestTimeout).count());
      drop(id);
    });
    loop_.watch(connection->fd.get(), EPOLLIN, [this, id](std::uint32_t) { on_readable(id); });
    connections_.emplace(id, std::move(connection));
  }
}

void MetricsServer::on_readable(std::uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& connection = *it->second;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::recv(connection.fd.get(), buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) return drop(id);  // hung up or failed before a whole request
    connection.in.append(buffer, static_cast<std::size_t>(n));
    if (connection.in.size() > kMaxRequestBytes) break;
  }
  if (connection.in.find("\r\n\r\n") != std::string::npos ||
      connection.in.find("\n\n") != std::string::npos) {
    return on_request(connection);
  }
  if (connection.in.size() > kMaxRequestBytes) {
    respond(connection, 431, "Request Header Fields Too Large", kTextPlain,
            fmt::format("a request head may have at most {} bytes\n", kMaxRequestBytes));
  }
}

void MetricsServer::on_request(Connection& connection) {
  std::string_view head = connection.in;
  std::string_view line = head.substr(0, head.find('\n'));
  if (line.ends_with('\r')) line.remove_suffix(1);
  std::size_t first = line.find(' ');
  std::size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos || line.find(' ', second + 1) != std::string_view::npos ||
      !line.substr(second + 1).starts_with("HTTP/")) {
    return respond(connection, 400, "Bad Request", kTextPlain, "not an HTTP/1 request line\n");
  }
  std::string_view method = line.substr(0, first);
  std::string_view target = line.substr(first + 1, second - first - 1);
  std::string_view path = target.substr(0, target.find('?'));
  if (path != "/metrics") {
    return respond(connection, 404, "Not Found", kTextPlain, "mpsshimd serves only /metrics here\n",
                   method == "HEAD");
  }
  if (method != "GET" && method != "HEAD") {
    return respond(connection, 405, "Method Not Allowed", kTextPlain,
                   "/metrics takes GET or HEAD\n", false, "Allow: GET, HEAD\r\n");
  }
  // The request is complete: stop reading, give the servers their time, then write.
  connection.answering = true;
  loop_.unwatch(connection.fd.get());
  loop_.cancel(connection.deadline);
  const std::uint64_t id = connection.id;
  connection.deadline = loop_.after(kResponseTimeout, [this, id] {
    log_debug("metrics connection did not take its answer within {} s; closed",
              std::chrono::seconds(kResponseTimeout).count());
    drop(id);
  });
  const bool head_only = method == "HEAD";
  std::weak_ptr<Connection> weak = connections_.at(id);
  collect_([this, weak, head_only](std::string body) {
    // The connection (and, with it, this server) may be gone by the time the servers answered.
    if (auto alive = weak.lock()) {
      respond(*alive, 200, "OK", kMetricsContentType, std::move(body), head_only);
    }
  });
}

void MetricsServer::respond(Connection& connection, int status, std::string_view reason,
                            std::string_view content_type, std::string body, bool head,
                            std::string_view extra_headers) {
  connection.out = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
      status, reason, content_type, body.size(), extra_headers);
  if (!head) connection.out += body;
  connection.written = 0;
  if (!connection.answering) {
    connection.answering = true;
    loop_.cancel(connection.deadline);
    const std::uint64_t id = connection.id;
    connection.deadline = loop_.after(kResponseTimeout, [this, id] { drop(id); });
  }
  const std::uint64_t id = connection.id;
  loop_.watch(connection.fd.get(), EPOLLOUT, [this, id](std::uint32_t) { on_writable(id); });
}

void MetricsServer::on_writable(std::uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& connection = *it->second;
  while (connection.written < connection.out.size()) {
    ssize_t n = ::send(connection.fd.get(), connection.out.data() + connection.written,
                       connection.out.size() - connection.written, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // wait for EPOLLOUT
    if (n <= 0) return drop(id);
    connection.written += static_cast<std::size_t>(n);
  }
  ::shutdown(connection.fd.get(), SHUT_WR);
  drop(id);
}

void MetricsServer::drop(std::uint64_t id) {
  auto node = connections_.extract(id);
  if (node.empty()) return;
  loop_.unwatch(node.mapped()->fd.get());
  loop_.cancel(node.mapped()->deadline);
}

}  // namespace mpsshim::daemon

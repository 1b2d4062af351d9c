#include "broker/daemon/ctl_client.hpp"

#include <fmt/format.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "broker/daemon/wire.hpp"
#include "proto/text_parts.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

namespace {

tl::unexpected<CtlFailure> failure(CtlFailure::Kind kind, std::string message, int error = 0) {
  return tl::unexpected(CtlFailure{kind, error, std::move(message)});
}

}  // namespace

tl::expected<CtlAnswer, CtlFailure> ask_daemon(const std::string& socket_path,
                                               const std::string& line,
                                               std::chrono::seconds timeout) {
  using Kind = CtlFailure::Kind;
  int fd = proto::connect_seqpacket(socket_path);
  if (fd < 0) {
    return failure(Kind::kCannotConnect,
                   fmt::format("cannot reach mpsshimd at {}: {}", socket_path, std::strerror(-fd)),
                   -fd);
  }
  proto::UniqueFd socket(fd);
  timeval limit{static_cast<time_t>(timeout.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  if (int error = proto::send_struct(fd, make_text(proto::MessageKind::kCtlRequest, 0, line));
      error != 0) {
    return failure(Kind::kNoAnswer, fmt::format("cannot send to mpsshimd at {}: {}", socket_path,
                                                std::strerror(error)));
  }
  // A long answer comes in parts (proto/text_parts.hpp).
  proto::TextAssembly assembly;
  for (;;) {
    proto::Received answer;
    int error = proto::receive_message(fd, answer);
    if (error == EAGAIN || error == EWOULDBLOCK) {
      return failure(Kind::kNoAnswer, fmt::format("mpsshimd at {} did not answer `{}` within {} s",
                                                  socket_path, line, timeout.count()));
    }
    auto header = error == 0 ? header_of(answer) : std::nullopt;
    if (!header || header->magic != proto::kHelloMagic) {
      return failure(
          Kind::kBadAnswer,
          fmt::format("mpsshimd at {} closed the connection without answering{}", socket_path,
                      error != 0 ? fmt::format(" ({})", std::strerror(error)) : ""));
    }
    auto kind = static_cast<proto::MessageKind>(header->kind);
    if (kind == proto::MessageKind::kRefused) {
      auto refused = decode<proto::Refused>(answer);
      return failure(Kind::kBadAnswer,
                     fmt::format("mpsshimd refused: {}",
                                 refused ? bounded_string(refused->message) : "(no reason given)"));
    }
    auto reply = decode<proto::TextMessage>(answer);
    if (kind != proto::MessageKind::kCtlReply || !reply) {
      return failure(
          Kind::kBadAnswer,
          fmt::format("mpsshimd answered with message kind {}, not a reply", header->kind));
    }
    if (assembly.add(*reply)) break;
  }
  return CtlAnswer{assembly.status(), assembly.text()};
}

}  // namespace mpsshim::daemon

#include "broker/server/session/client_socket.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {
namespace {

void violation(Session& session, std::string why) {
  session.life.end_requested = std::move(why);
  session.life.end_notify = CUDA_ERROR_MPS_RPC_FAILURE;
}

}  // namespace

std::size_t pump_client_socket(Session& session) {
  std::size_t count = 0;
  proto::Received message;
  while (session.life.end_requested.empty() && session.socket) {
    int rc = proto::receive_message(session.socket.get(), message);
    if (rc == EAGAIN || rc == EWOULDBLOCK) break;
    if (rc != 0 && rc != EMSGSIZE) {
      session.life.end_requested = fmt::format("its socket failed ({})", std::strerror(rc));
      break;
    }
    if (rc == 0 && message.bytes.empty()) {
      session.life.end_requested = "disconnected";
      break;
    }
    ++count;
    proto::FdTransfer transfer{};
    if (message.bytes.size() != sizeof transfer) {
      violation(session, fmt::format("sent a {}-byte socket message; only fd transfers are "
                                     "expected during a session",
                                     message.bytes.size()));
      break;
    }
    std::memcpy(&transfer, message.bytes.data(), sizeof transfer);
    auto kind = static_cast<proto::MessageKind>(transfer.header.kind);
    if (transfer.header.magic != proto::kHelloMagic || transfer.header.size != sizeof transfer ||
        (kind != proto::MessageKind::kHostMemory && kind != proto::MessageKind::kModuleImage &&
         kind != proto::MessageKind::kPeerMemory) ||
        message.fds.size() != 1) {
      violation(session, fmt::format("sent a malformed fd transfer (kind {}, {} fds)",
                                     transfer.header.kind, message.fds.size()));
      break;
    }
    if (session.stash.size() >= kMaxStashedFds) {
      violation(session, fmt::format("sent more than {} memfds it did not use", kMaxStashedFds));
      break;
    }
    auto [it, inserted] = session.stash.try_emplace(
        transfer.token, StashedFd{kind, transfer.bytes, std::move(message.fds[0])});
    if (!inserted) {
      violation(session, fmt::format("sent two memfds under token {}", transfer.token));
      break;
    }
  }
  return count;
}

tl::expected<StashedFd, CUresult> take_stashed_fd(Session& session, std::uint32_t token,
                                                  proto::MessageKind kind) {
  auto it = session.stash.find(token);
  if (it == session.stash.end()) {
    pump_client_socket(session);
    it = session.stash.find(token);
  }
  if (it == session.stash.end()) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  StashedFd stashed = std::move(it->second);
  session.stash.erase(it);
  if (stashed.kind != kind) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  return stashed;
}

CUresult send_memory_fd(Session& session, proto::UniqueFd fd, std::uint64_t bytes) {
  proto::FdTransfer transfer{
      proto::make_header(proto::MessageKind::kPeerMemory, sizeof(proto::FdTransfer)), 0, 0, bytes};
  const int fds[] = {fd.get()};
  if (int err = proto::send_struct(session.socket.get(), transfer, fds); err != 0) {
    log_warn("{}: could not send a memory block's fd: {}", session.who(), std::strerror(err));
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::server

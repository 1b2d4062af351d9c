// The client's socket during a session: memfds arrive on it (FdTransfer, before the ring
// record that names their token), and its hang-up is how the server learns the client died.
#pragma once

#include <cstdint>
#include <tl/expected.hpp>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// Reads every message waiting on the (non-blocking) socket and stashes their memfds. On
// hang-up or a message that breaks the protocol it sets session.life.end_requested.
// Returns the number of messages read.
std::size_t pump_client_socket(Session& session);

// The memfd sent under `token` as a message of `kind`, looking in the socket when it is not
// stashed yet. Missing or of the wrong kind: CUDA_ERROR_INVALID_VALUE.
tl::expected<StashedFd, CUresult> take_stashed_fd(Session& session, std::uint32_t token,
                                                  proto::MessageKind kind);

// Sends the client a GPU memory block's fd (kPeerMemory: kPeerExport, kVmmExport), before the
// answer to its call: the client reads its socket once it has the answer. Takes the fd (closed
// here). CUDA_ERROR_OPERATING_SYSTEM, logged, when the socket refuses it.
CUresult send_memory_fd(Session& session, proto::UniqueFd fd, std::uint64_t bytes);

// Most memfds a client may have sent and not yet used: each is an open file in the server.
inline constexpr std::size_t kMaxStashedFds = 256;

}  // namespace mpsshim::server

// The front door: accepts connections on the control socket, gives each a few seconds to say
// who it is, checks its ABI version and SO_PEERCRED, and passes it on: a device query is
// answered here, an attach goes to the GPU's server, an mpsshimctl command to Commands.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/daemon/access_policy.hpp"
#include "broker/daemon/allocations.hpp"
#include "broker/daemon/client_view.hpp"
#include "broker/daemon/commands.hpp"
#include "broker/daemon/config_file.hpp"
#include "broker/daemon/event_loop.hpp"
#include "broker/daemon/isolation.hpp"
#include "broker/daemon/supervisor.hpp"
#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

class ClientGate {
 public:
  // A peer that has not sent its first message by then is dropped: a slow or hostile peer
  // costs one fd for this long, never the daemon's attention.
  static constexpr auto kFirstMessageTimeout = std::chrono::seconds(5);
  static constexpr std::size_t kMaxWaiting = 256;
  // Room for later minor versions to append to the 432-byte ClientHello; anything longer is
  // not a hello.
  static constexpr std::size_t kMaxHelloBytes = 4096;

  ClientGate(EventLoop& loop, Supervisor& supervisor, Commands& commands,
             const AllocationRegistry& allocations, AccessPolicy policy,
             IsolationRule isolation = IsolationRule::kShared,
             const std::vector<ClientClass>* classes = nullptr,
             std::chrono::seconds isolate_after_fault = std::chrono::seconds(0));
  ~ClientGate();

  void listen(proto::UniqueFd listener);  // a listening SOCK_SEQPACKET socket
  // Shutdown: stop accepting and drop connections that have not said who they are. Commands
  // still waiting for servers keep their connection until answered.
  void close();

 private:
  struct Waiting {
    proto::UniqueFd fd;
    proto::PeerCredentials peer;
    EventLoop::TimerId deadline;
  };

  void accept_all();
  void on_readable(int fd);
  void on_first_message(Waiting connection, const proto::Received& message);
  // A client's hello with its strings ended inside their fields, and who it is for the log; or
  // nullopt when the access policy refuses it (refused and logged here).
  std::optional<std::string> accept_client(const Waiting& connection, proto::ClientHello& hello);
  void on_client(Waiting connection, proto::MessageKind kind, const proto::ClientHello& hello);
  void on_command(Waiting connection, const proto::TextMessage& request);
  // kClientView (docs/nvml.md): the share the peer sees, from the servers' `ps` answers.
  void on_client_view(Waiting connection, const proto::ClientViewRequest& request);
  void ask_servers_for_views();
  void answer_views(const std::vector<ServerClients>& ps);
  void refuse(const Waiting& connection, int cuda_error, const std::string& message);
  Waiting take(int fd);

  EventLoop& loop_;
  Supervisor& supervisor_;
  Commands& commands_;
  const AllocationRegistry& allocations_;
  AccessPolicy policy_;
  IsolationRule isolation_;
  const std::vector<ClientClass>* classes_;  // the daemon's; a reload replaces them
  // --isolate-after-fault: for this long after a fault, a new client of the culprit's uid and
  // program gets an isolation group of its own (0: never).
  std::chrono::seconds isolate_after_fault_;
  proto::UniqueFd listener_;
  std::unordered_map<int, Waiting> waiting_;            // by fd: no first message yet
  std::unordered_map<int, proto::UniqueFd> answering_;  // by fd: a command awaiting servers
  proto::Received scratch_;
  BusySampler busy_;  // the GPUs' busy time at the last client view
  struct WaitingView {
    int fd;  // in answering_
    ViewContext context;
  };
  std::vector<WaitingView> views_waiting_;  // asked since the servers were last asked
};

}  // namespace mpsshim::daemon

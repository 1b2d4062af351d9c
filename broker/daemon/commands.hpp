// The operator commands mpsshimctl sends (text in, text out): a superset of
// nvidia-cuda-mps-control's. Some need the servers' answers, so a command finishes through a
// callback, possibly after execute() has returned.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "broker/daemon/allocations.hpp"
#include "broker/daemon/client_table.hpp"
#include "broker/daemon/supervisor.hpp"

namespace mpsshim::daemon {

struct CtlReply {
  int status = 0;  // 0 = ok; mpsshimctl exits 1 otherwise
  std::string text;
  bool json = false;  // text is already the JSON object `--json` asked for
};
using ReplyHandler = std::function<void(CtlReply)>;

class Commands {
 public:
  static constexpr auto kServerTimeout = std::chrono::milliseconds(2000);
  // suspend and resume copy a client's memory (the server gives itself 300 s).
  static constexpr auto kSuspendTimeout = std::chrono::milliseconds(310'000);

  Commands(Supervisor& supervisor, AllocationRegistry& allocations,
           std::function<void()> request_shutdown,
           std::function<tl::expected<std::string, std::string>()> reload = nullptr);

  // `reply` runs exactly once. A word `--json` anywhere after the command asks for the answer
  // as one JSON object: the command's figures where it has some, else {"ok": ..., "message":
  // ...} (docs/daemon.md).
  void execute(std::string_view line, ReplyHandler reply);

  // The metrics endpoint's source: every running server's answers to the `ps` query and to the
  // `stats` query, asked at once and gathered as `ps` and `stats` gather them (each server has
  // kServerTimeout to answer; a server that did not answer is missing from the list). `done`
  // runs exactly once, possibly before client_reports() returns.
  struct ClientReports {
    std::vector<ServerClients> ps;
    std::vector<ServerClients> stats;
  };
  void client_reports(std::function<void(ClientReports)> done);

  // Sends kServerStatsQuery `text` to every running server; `done` gets their answers, a line
  // for each GPU whose server is not running (notes) and one for each that did not answer
  // (problems: the command failed).
  using ClientsHandler =
      std::function<void(std::vector<ServerClients>, std::string notes, std::string problems)>;
  void query_clients(const std::string& text, ClientsHandler done);

 private:
  using Args = std::vector<std::string>;
  struct Command {
    std::string_view name;
    std::string_view usage;
    std::string_view help;
    std::size_t min_args;
    std::size_t max_args;  // SIZE_MAX: the rest of the line
    void (Commands::*run)(const Args&, bool json, ReplyHandler);
  };
  static const std::vector<Command>& table();

  void help(const Args&, bool json, ReplyHandler reply);
  void server_list(const Args&, bool json, ReplyHandler reply);
  void device_query(const Args&, bool json, ReplyHandler reply);
  void gpu_states(const Args&, bool json, ReplyHandler reply);
  void ps(const Args&, bool json, ReplyHandler reply);
  void stats(const Args&, bool json, ReplyHandler reply);
  void terminate_client(const Args&, bool json, ReplyHandler reply);
  void suspend_client(const Args&, bool json, ReplyHandler reply);
  void resume_client(const Args&, bool json, ReplyHandler reply);
  void suspend_or_resume(const char* request, const Args& args, ReplyHandler reply);
  void set_default_percentage(const Args&, bool json, ReplyHandler reply);
  void get_default_percentage(const Args&, bool json, ReplyHandler reply);
  void set_default_memory_limit(const Args&, bool json, ReplyHandler reply);
  void get_default_memory_limit(const Args&, bool json, ReplyHandler reply);
  void set_client_percentage(const Args&, bool json, ReplyHandler reply);
  void set_client_memory_limit(const Args&, bool json, ReplyHandler reply);
  void server_command(const Args&, bool json, ReplyHandler reply);
  void quit(const Args&, bool json, ReplyHandler reply);
  void reload(const Args&, bool json, ReplyHandler reply);
  void register_allocation(const Args&, bool json, ReplyHandler reply);
  void revoke_allocation(const Args&, bool json, ReplyHandler reply);
  void label_allocation(const Args&, bool json, ReplyHandler reply);
  void list_allocations(const Args&, bool json, ReplyHandler reply);
  // partition_commands.cpp
  void sm_partition(const Args&, bool json, ReplyHandler reply);
  void lspart(const Args&, bool json, ReplyHandler reply);

  // Sends `text` to GPU `gpu`'s shared server as a kCtlRequest and replies with its answer.
  void ask_server(int gpu, const std::string& text, ReplyHandler reply);
  // Sends a command about one client to every server of GPU `gpu` (the shared one and its
  // isolation groups'): the answer of the server that took it, else the refusal of the one that
  // has the client, else the shared server's.
  void ask_client_server(int gpu, proto::MessageKind kind, const std::string& text,
                         ReplyHandler reply, std::chrono::milliseconds timeout = kServerTimeout);
  // The GPU an argument names, or an error reply.
  tl::expected<int, std::string> gpu_argument(const std::string& text) const;
  // Sends `text` to the running servers of `gpus`; `done` gets one line per GPU and whether all
  // of them took it.
  void tell_servers(const std::vector<int>& gpus, const std::string& text,
                    std::function<void(std::string, bool)> done);

  Supervisor& supervisor_;
  AllocationRegistry& allocations_;
  std::function<void()> request_shutdown_;
  std::function<tl::expected<std::string, std::string>()> reload_;
};

}  // namespace mpsshim::daemon

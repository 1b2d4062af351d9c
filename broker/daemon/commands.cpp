#include "broker/daemon/commands.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <climits>
#include <memory>
#include <sstream>

#include "broker/daemon/client_table.hpp"
#include "broker/daemon/log.hpp"
#include "broker/daemon/server_report.hpp"
#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

namespace {

using proto::MessageKind;

std::vector<std::string> split_words(std::string_view line) {
  std::istringstream in{std::string(line)};
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::optional<long> parse_integer(const std::string& text) {
  long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

CtlReply error_reply(std::string text) {
  return CtlReply{1, std::move(text)};
}

// A `--json` answer with figures: the object, with "ok" added. Text from outside (an operator's
// command line, a client's program name) may not be UTF-8: its bad bytes become U+FFFD rather
// than throwing out of the daemon's loop (found by tests/fuzz/fuzz_limits).
CtlReply json_reply(int status, nlohmann::json object) {
  object["ok"] = status == 0;
  return CtlReply{status, object.dump(2, ' ', false, nlohmann::json::error_handler_t::replace),
                  true};
}

// One server's answer, with which server it was (its GPU, its isolation group, "" for the
// GPU's shared server).
struct SlotAnswer {
  int gpu = 0;
  std::string group;
  tl::expected<ServerAnswer, std::string> answer{tl::unexpect, ""};

  // "GPU 0", "GPU 0 (isolation group uid:1000)": where a line of an answer comes from.
  std::string where() const {
    return group.empty() ? fmt::format("GPU {}", gpu)
                         : fmt::format("GPU {} (isolation group {})", gpu, group);
  }
};

// Runs `done` with every server's answer once the last one has arrived or failed.
class AnswerCollector {
 public:
  using Answer = tl::expected<ServerAnswer, std::string>;
  using Done = std::function<void(std::vector<SlotAnswer>)>;

  // `slots`: the servers to ask (Supervisor::request).
  static void ask(Supervisor& supervisor, const std::vector<int>& slots, MessageKind kind,
                  const std::string& text, Done done,
                  std::chrono::milliseconds timeout = Commands::kServerTimeout) {
    auto collector = std::make_shared<AnswerCollector>(slots.size(), std::move(done));
    if (slots.empty()) {
      collector->finish();
      return;
    }
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (const ServerStatus* status = supervisor.status_of_slot(slots[i])) {
        collector->answers_[i].gpu = status->ordinal;
        collector->answers_[i].group = status->group;
      }
      supervisor.request(slots[i], kind, text, timeout,
                         [collector, i](Answer answer) { collector->fill(i, std::move(answer)); });
    }
  }

  AnswerCollector(std::size_t count, Done done)
      : answers_(count), remaining_(count), done_(std::move(done)) {}

 private:
  void fill(std::size_t i, Answer answer) {
    answers_[i].answer = std::move(answer);
    if (--remaining_ == 0) finish();
  }
  void finish() { done_(std::move(answers_)); }

  std::vector<SlotAnswer> answers_;
  std::size_t remaining_;
  Done done_;
};

}  // namespace

Commands::Commands(Supervisor& supervisor, AllocationRegistry& allocations,
                   std::function<void()> request_shutdown,
                   std::function<tl::expected<std::string, std::string>()> reload)
    : supervisor_(supervisor),
      allocations_(allocations),
      request_shutdown_(std::move(request_shutdown)),
      reload_(std::move(reload)) {}

const std::vector<Commands::Command>& Commands::table() {
  static const std::vector<Command> commands{
      {"help", "help", "this list", 0, 0, &Commands::help},
      {"server_list", "server_list", "each GPU's server: pid, state, restarts", 0, 0,
       &Commands::server_list},
      {"device_query", "device_query", "each GPU: name, UUID, memory, SMs, driver version", 0, 0,
       &Commands::device_query},
      {"gpu_states", "gpu_states",
       "each GPU as key=value fields for programs: gpu, state, restarts, uuid, memory, sms, name",
       0, 0, &Commands::gpu_states},
      {"ps", "ps",
       "every client of every GPU: pid, user, SMs, memory (in use, peak, limit), pinned host "
       "memory, kernels launched, GPU busy time (mpsshimd --busy-time on), bytes copied each way, "
       "priority, state, start, "
       "allocation (pod)",
       0, 0, &Commands::ps},
      {"stats", "stats",
       "every client of every GPU: records, server time, delay from the client's send to the "
       "server's start (p50, p99, max), the operations that took the most server time",
       0, 0, &Commands::stats},
      {"terminate_client", "terminate_client <gpu> <pid>",
       "end client <pid> on GPU <gpu>; its CUDA calls fail from then on", 2, 2,
       &Commands::terminate_client},
      {"set_default_active_thread_percentage", "set_default_active_thread_percentage <1-100>",
       "share of SMs new clients get unless they set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", 1, 1,
       &Commands::set_default_percentage},
      {"get_default_active_thread_percentage", "get_default_active_thread_percentage",
       "the default share of SMs, in percent", 0, 0, &Commands::get_default_percentage},
      {"set_default_device_pinned_mem_limit", "set_default_device_pinned_mem_limit <gpu> <size>",
       "device memory new clients of <gpu> may use unless they set "
       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (e.g. 4G; 0 = no limit)",
       2, 2, &Commands::set_default_memory_limit},
      {"get_default_device_pinned_mem_limit", "get_default_device_pinned_mem_limit <gpu>",
       "the default device memory limit of <gpu> (0 = none)", 1, 1,
       &Commands::get_default_memory_limit},
      {"set_active_thread_percentage", "set_active_thread_percentage <gpu> <pid> <1-100>",
       "move the running client <pid> of GPU <gpu> to a share of the SMs: its later work runs "
       "in a green context of the new size, work already queued finishes where it is",
       3, 3, &Commands::set_client_percentage},
      {"set_device_pinned_mem_limit", "set_device_pinned_mem_limit <gpu> <pid> <size>",
       "change the device memory limit of the running client <pid> of GPU <gpu> (e.g. 4G; 0 = "
       "no limit); below what it uses, its allocations are refused until it uses less",
       3, 3, &Commands::set_client_memory_limit},
      {"suspend", "suspend <gpu> <pid>",
       "take the running client <pid> off GPU <gpu> without telling it: its calls wait, the "
       "work it issued finishes, its device memory is copied to the server's host memory and "
       "given back to the GPU (docs/suspend.md)",
       2, 2, &Commands::suspend_client},
      {"resume", "resume <gpu> <pid>",
       "put a suspended client's memory back on GPU <gpu> at the same addresses and let its "
       "calls go on; fails, leaving it suspended, when the GPU has no room for it",
       2, 2, &Commands::resume_client},
      {"sm_partition", "sm_partition add <gpu> <sm count> | sm_partition rm <id>",
       "static SM partitions, as NVIDIA MPS's: add cuts <sm count> SMs (rounded up to the "
       "GPU's partition size) of <gpu> that no other partition has and answers its id, for "
       "clients' CUDA_MPS_SM_PARTITION; rm removes one no client runs in",
       2, 3, &Commands::sm_partition},
      {"lspart", "lspart", "the static SM partitions: id, GPU, groups, SMs, clients", 0, 0,
       &Commands::lspart},
      {"server_command", "server_command <gpu> <text...>",
       "pass a command the daemon does not know to GPU <gpu>'s server and show its answer", 2,
       SIZE_MAX, &Commands::server_command},
      {"register_allocation",
       "register_allocation [sm=P] [memory=SIZE] [gpus=N,..] [devices=ID,..] [namespace=NS] "
       "[pod=NAME] [slot=K/N] [token=HEX] [isolation=own|shared]",
       "a pod's allocation (the device plugin's): its clients get at most sm% of the SMs and "
       "share one memory limit per GPU, and with isolation=own servers of their own; answers "
       "`allocation=ID token=HEX` (docs/kubernetes.md)",
       0, 9, &Commands::register_allocation},
      {"revoke_allocation", "revoke_allocation <id>",
       "forget an allocation: its token is refused from now on (running clients keep going)", 1, 1,
       &Commands::revoke_allocation},
      {"label_allocation", "label_allocation <id> <namespace> <pod>",
       "name the pod an allocation belongs to, for ps and the metrics", 3, 3,
       &Commands::label_allocation},
      {"list_allocations", "list_allocations", "every registered allocation (not its token)", 0, 0,
       &Commands::list_allocations},
      {"reload", "reload",
       "read mpsshimd --config FILE again (as SIGHUP does): its classes for new clients, its "
       "default quotas for every server; a file with a mistake is refused and the old "
       "configuration stays",
       0, 0, &Commands::reload},
      {"quit", "quit", "stop every server and the daemon", 0, 0, &Commands::quit},
  };
  return commands;
}

void Commands::execute(std::string_view line, ReplyHandler reply) {
  Args words = split_words(line);
  const bool json = std::erase(words, std::string("--json")) != 0;
  if (json) {
    // Commands without figures of their own answer {"ok": ..., "message": ...}.
    reply = [reply = std::move(reply)](CtlReply answer) {
      if (!answer.json) {
        std::string message = answer.text;
        while (!message.empty() && message.back() == '\n') message.pop_back();
        answer.text = nlohmann::json{{"ok", answer.status == 0}, {"message", message}}.dump(
            2, ' ', false, nlohmann::json::error_handler_t::replace);
      }
      answer.text += '\n';
      reply(std::move(answer));
    };
  }
  if (words.empty()) {
    reply(error_reply("empty command; `help` lists the commands"));
    return;
  }
  for (const Command& command : table()) {
    if (command.name != words.front()) continue;
    Args args(words.begin() + 1, words.end());
    if (args.size() < command.min_args || args.size() > command.max_args) {
      reply(error_reply(fmt::format("usage: {} [--json]", command.usage)));
      return;
    }
    (this->*command.run)(args, json, std::move(reply));
    return;
  }
  reply(error_reply(fmt::format("unknown command `{}`; `help` lists the commands", words.front())));
}

void Commands::help(const Args&, bool json, ReplyHandler reply) {
  if (json) {
    nlohmann::json commands = nlohmann::json::array();
    for (const Command& command : table()) {
      commands.push_back(
          {{"name", command.name}, {"usage", command.usage}, {"help", command.help}});
    }
    return reply(json_reply(0, {{"commands", std::move(commands)}}));
  }
  std::string text = "commands (each takes --json: the answer as one JSON object):\n";
  for (const Command& command : table()) {
    text += fmt::format("  {}\n      {}\n", command.usage, command.help);
  }
  reply(CtlReply{0, text});
}

void Commands::server_list(const Args&, bool json, ReplyHandler reply) {
  if (json) return reply(json_reply(0, {{"servers", server_list_json(supervisor_)}}));
  reply(CtlReply{0, format_server_list(supervisor_)});
}

void Commands::gpu_states(const Args&, bool json, ReplyHandler reply) {
  if (json) return reply(json_reply(0, {{"gpus", gpu_states_json(supervisor_)}}));
  reply(CtlReply{0, format_gpu_states(supervisor_)});
}

void Commands::device_query(const Args&, bool json, ReplyHandler reply) {
  if (json) return reply(json_reply(0, {{"gpus", device_query_json(supervisor_)}}));
  reply(CtlReply{0, format_device_query(supervisor_)});
}

tl::expected<int, std::string> Commands::gpu_argument(const std::string& text) const {
  auto gpu = parse_integer(text);
  if (!gpu || *gpu < 0) return tl::unexpected(fmt::format("`{}` is not a GPU number", text));
  if (*gpu >= supervisor_.gpu_count()) {
    if (!supervisor_.gpu_count_known()) {
      return tl::unexpected(
          std::string("the GPU count is not known yet (the server for GPU 0 is starting)"));
    }
    return tl::unexpected(fmt::format("there is no GPU {}: mpsshimd manages GPUs 0 to {}", *gpu,
                                      supervisor_.gpu_count() - 1));
  }
  return static_cast<int>(*gpu);
}

void Commands::query_clients(const std::string& text, ClientsHandler done) {
  std::vector<int> ready;
  std::string notes;
  for (int i = 0; i < supervisor_.gpu_count(); ++i) {
    ServerState state = supervisor_.status(i).state;
    if (state != ServerState::kRunning) {
      notes += fmt::format("GPU {}: the server is {}; its clients are not listed\n", i,
                           state_name(state));
    }
    // Its isolation groups' servers too, whatever the shared one's state.
    for (int slot : supervisor_.running_slots(i)) ready.push_back(slot);
  }
  AnswerCollector::ask(supervisor_, ready, MessageKind::kServerStatsQuery, text,
                       [done = std::move(done), notes](auto answers) mutable {
                         std::vector<ServerClients> clients;
                         std::string problems;
                         for (SlotAnswer& reply : answers) {
                           if (reply.answer) {
                             clients.push_back(ServerClients{
                                 reply.gpu, with_isolation_group(reply.answer->text, reply.group)});
                           } else {
                             problems += fmt::format("{}: {}; its clients are not listed\n",
                                                     reply.where(), reply.answer.error());
                           }
                         }
                         done(std::move(clients), std::move(notes), std::move(problems));
                       });
}

void Commands::ps(const Args&, bool json, ReplyHandler reply) {
  query_clients("", [this, reply = std::move(reply), json](auto clients, auto notes,
                                                           auto problems) {
    const int status = problems.empty() ? 0 : 1;
    if (json) {
      for (ServerClients& server : clients) {
        server.text = with_pod_fields(allocations_, server.text);
      }
      nlohmann::json table = client_table_json(clients, notes + problems);
      nlohmann::json faults = nlohmann::json::array();
      for (const FaultReport& fault : supervisor_.faults().recent()) {
        faults.push_back(fault_json(fault));
      }
      table["faults"] = std::move(faults);
      return reply(json_reply(status, std::move(table)));
    }
    auto allocation_name = [this](const std::string& id) {
      auto number = parse_integer(id);
      const Allocation* allocation =
          number && *number > 0 ? allocations_.find(static_cast<std::uint32_t>(*number)) : nullptr;
      // An allocation revoked while its clients run keeps its id in ps.
      return allocation == nullptr ? id + " (revoked)" : id + " " + pod_of(*allocation);
    };
    std::string faults;
    for (const FaultReport& fault : supervisor_.faults().recent()) {
      faults += describe_fault(fault) + "\n";
    }
    reply(CtlReply{status,
                   format_client_table(clients, allocation_name) + notes + problems + faults});
  });
}

void Commands::client_reports(std::function<void(ClientReports)> done) {
  struct Gathering {
    ClientReports reports;
    int remaining = 2;
    std::function<void(ClientReports)> done;
  };
  auto gathering = std::make_shared<Gathering>();
  gathering->done = std::move(done);
  auto finish_one = [gathering] {
    if (--gathering->remaining == 0) gathering->done(std::move(gathering->reports));
  };
  query_clients("", [gathering, finish_one](auto clients, auto, auto) {
    gathering->reports.ps = std::move(clients);
    finish_one();
  });
  query_clients("stats", [gathering, finish_one](auto clients, auto, auto) {
    gathering->reports.stats = std::move(clients);
    finish_one();
  });
}

void Commands::stats(const Args&, bool json, ReplyHandler reply) {
  query_clients("stats", [reply = std::move(reply), json](auto clients, auto notes, auto problems) {
    const int status = problems.empty() ? 0 : 1;
    if (json) return reply(json_reply(status, stats_json(clients, notes + problems)));
    reply(CtlReply{status, format_stats_table(clients) + notes + problems});
  });
}

void Commands::terminate_client(const Args& args, bool, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  auto pid = parse_integer(args[1]);
  if (!pid || *pid <= 0) return reply(error_reply(fmt::format("`{}` is not a pid", args[1])));
  ask_client_server(*gpu, MessageKind::kServerTerminateClient, std::to_string(*pid),
                    std::move(reply));
}

void Commands::ask_client_server(int gpu, MessageKind kind, const std::string& text,
                                 ReplyHandler reply, std::chrono::milliseconds timeout) {
  // The client is on one of the GPU's servers: the shared one or an isolation group's. Each
  // that does not have it says so; the one that has it answers for the command.
  AnswerCollector::ask(
      supervisor_, supervisor_.running_slots(gpu), kind, text,
      [reply = std::move(reply), gpu](std::vector<SlotAnswer> answers) {
        if (answers.empty()) {
          return reply(error_reply(fmt::format("GPU {} has no running server", gpu)));
        }
        for (SlotAnswer& one : answers) {
          if (one.answer && one.answer->status == 0) return reply(CtlReply{0, one.answer->text});
        }
        // None took it: the server that has the client says why it refused; else the shared
        // server's answer (first).
        for (SlotAnswer& one : answers) {
          if (one.answer && !one.answer->text.starts_with("no client with pid")) {
            return reply(CtlReply{1, one.answer->text});
          }
        }
        SlotAnswer& first = answers.front();
        if (!first.answer) return reply(error_reply(first.answer.error()));
        reply(CtlReply{1, first.answer->text});
      },
      timeout);
}

void Commands::tell_servers(const std::vector<int>& gpus, const std::string& text,
                            std::function<void(std::string, bool)> done) {
  std::vector<int> running;
  std::string lines;
  for (int gpu : gpus) {
    if (supervisor_.status(gpu).state != ServerState::kRunning) {
      lines += fmt::format("GPU {}: the server is {}; it gets the value when it starts\n", gpu,
                           state_name(supervisor_.status(gpu).state));
    }
    // Isolation groups' servers of the GPU take it too.
    for (int slot : supervisor_.running_slots(gpu)) running.push_back(slot);
  }
  AnswerCollector::ask(supervisor_, running, MessageKind::kCtlRequest, text,
                       [done = std::move(done), lines](auto answers) mutable {
                         bool all_ok = true;
                         for (SlotAnswer& one : answers) {
                           if (one.answer && one.answer->status == 0) continue;
                           all_ok = false;
                           lines += fmt::format("{}: not applied: {}\n", one.where(),
                                                one.answer ? one.answer->text : one.answer.error());
                         }
                         done(std::move(lines), all_ok);
                       });
}

void Commands::set_default_percentage(const Args& args, bool, ReplyHandler reply) {
  auto percentage = parse_integer(args[0]);
  if (!percentage || *percentage < 1 || *percentage > 100) {
    return reply(error_reply(
        fmt::format("`{}` is not a percentage: give a whole number from 1 to 100", args[0])));
  }
  int value = static_cast<int>(*percentage);
  supervisor_.defaults().sm_percentage = value;
  std::vector<int> gpus;
  for (int i = 0; i < supervisor_.gpu_count(); ++i) gpus.push_back(i);
  tell_servers(
      gpus, fmt::format("set_default_active_thread_percentage {}", value),
      [reply = std::move(reply), value](std::string lines, bool all_ok) {
        reply(CtlReply{all_ok ? 0 : 1, fmt::format("default active thread percentage is {} for new "
                                                   "clients\n{}",
                                                   value, lines)});
      });
}

void Commands::get_default_percentage(const Args&, bool json, ReplyHandler reply) {
  const int value = supervisor_.defaults().sm_percentage.value_or(100);
  if (json) return reply(json_reply(0, {{"value", value}}));
  reply(CtlReply{0, fmt::format("{}\n", value)});
}

void Commands::set_default_memory_limit(const Args& args, bool, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  auto bytes = parse_size(args[1]);
  if (!bytes) {
    return reply(error_reply(fmt::format(
        "`{}` is not a size: give a number with an optional K, M, G or T (e.g. 4G)", args[1])));
  }
  supervisor_.defaults().memory_limit_by_gpu[*gpu] = *bytes;
  tell_servers(
      {*gpu}, fmt::format("set_default_memory_limit {}", *bytes),
      [reply = std::move(reply), gpu = *gpu, bytes = *bytes](std::string lines, bool all_ok) {
        std::string value = bytes == 0 ? "no limit" : format_size(bytes);
        reply(CtlReply{all_ok ? 0 : 1,
                       fmt::format("default device memory limit of GPU {} is {} for new "
                                   "clients\n{}",
                                   gpu, value, lines)});
      });
}

void Commands::get_default_memory_limit(const Args& args, bool json, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  const std::uint64_t bytes = supervisor_.defaults().memory_limit_of(*gpu);
  if (json) return reply(json_reply(0, {{"gpu", *gpu}, {"bytes", bytes}}));
  reply(CtlReply{0, fmt::format("{}\n", format_size(bytes))});
}

void Commands::ask_server(int gpu, const std::string& text, ReplyHandler reply) {
  supervisor_.request(gpu, MessageKind::kCtlRequest, text, kServerTimeout,
                      [reply = std::move(reply)](auto answer) {
                        if (!answer) return reply(error_reply(answer.error()));
                        reply(CtlReply{answer->status == 0 ? 0 : 1, answer->text});
                      });
}

void Commands::set_client_percentage(const Args& args, bool, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  auto pid = parse_integer(args[1]);
  if (!pid || *pid <= 0) return reply(error_reply(fmt::format("`{}` is not a pid", args[1])));
  auto percentage = parse_integer(args[2]);
  if (!percentage || *percentage < 1 || *percentage > 100) {
    return reply(error_reply(
        fmt::format("`{}` is not a percentage: give a whole number from 1 to 100", args[2])));
  }
  ask_client_server(*gpu, MessageKind::kCtlRequest,
                    fmt::format("set_client_active_thread_percentage {} {}", *pid, *percentage),
                    std::move(reply));
}

void Commands::set_client_memory_limit(const Args& args, bool, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  auto pid = parse_integer(args[1]);
  if (!pid || *pid <= 0) return reply(error_reply(fmt::format("`{}` is not a pid", args[1])));
  auto bytes = parse_size(args[2]);
  if (!bytes) {
    return reply(error_reply(fmt::format(
        "`{}` is not a size: give a number with an optional K, M, G or T (e.g. 4G)", args[2])));
  }
  ask_client_server(*gpu, MessageKind::kCtlRequest,
                    fmt::format("set_client_memory_limit {} {}", *pid, *bytes), std::move(reply));
}

void Commands::suspend_client(const Args& args, bool, ReplyHandler reply) {
  suspend_or_resume("suspend_client", args, std::move(reply));
}

void Commands::resume_client(const Args& args, bool, ReplyHandler reply) {
  suspend_or_resume("resume_client", args, std::move(reply));
}

void Commands::suspend_or_resume(const char* request, const Args& args, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  auto pid = parse_integer(args[1]);
  if (!pid || *pid <= 0) return reply(error_reply(fmt::format("`{}` is not a pid", args[1])));
  ask_client_server(
      *gpu, MessageKind::kCtlRequest, fmt::format("{} {}", request, *pid),
      [reply = std::move(reply)](CtlReply answer) {
        if (!answer.text.empty() && answer.text.back() != '\n') answer.text += '\n';
        reply(std::move(answer));
      },
      kSuspendTimeout);
}

void Commands::server_command(const Args& args, bool, ReplyHandler reply) {
  auto gpu = gpu_argument(args[0]);
  if (!gpu) return reply(error_reply(gpu.error()));
  ask_server(*gpu, fmt::format("{}", fmt::join(args.begin() + 1, args.end(), " ")),
             std::move(reply));
}

void Commands::quit(const Args&, bool, ReplyHandler reply) {
  reply(CtlReply{
      0, fmt::format("mpsshimd (pid {}) is stopping its servers and exiting\n", ::getpid())});
  request_shutdown_();
}

void Commands::reload(const Args&, bool, ReplyHandler reply) {
  if (!reload_) return reply(error_reply("this mpsshimd cannot reload its configuration"));
  auto reloaded = reload_();
  if (!reloaded) return reply(error_reply(reloaded.error() + "\n"));
  reply(CtlReply{0, "configuration reloaded from " + *reloaded + "\n"});
}

void Commands::register_allocation(const Args& args, bool json, ReplyHandler reply) {
  auto allocation = allocations_.add(args);
  if (!allocation) {
    return reply(error_reply(fmt::format("register_allocation: {}", allocation.error())));
  }
  const Allocation& a = **allocation;
  log_info("allocation {} registered: pod {}, GPUs {}, {}% of the SMs, memory {}, devices {}", a.id,
           pod_of(a), a.gpus.empty() ? "any" : fmt::format("{}", fmt::join(a.gpus, ",")),
           a.sm_percentage == 0 ? 100 : a.sm_percentage,
           a.memory_limit == 0 ? "unlimited" : format_size(a.memory_limit),
           a.devices.empty() ? "-" : fmt::format("{}", fmt::join(a.devices, ",")));
  if (json) return reply(json_reply(0, {{"allocation", a.id}, {"token", a.token}}));
  reply(CtlReply{0, fmt::format("allocation={} token={}\n", a.id, a.token)});
}

void Commands::revoke_allocation(const Args& args, bool, ReplyHandler reply) {
  auto id = parse_integer(args[0]);
  if (!id || *id <= 0 || !allocations_.revoke(static_cast<std::uint32_t>(*id))) {
    return reply(error_reply(fmt::format("there is no allocation `{}`", args[0])));
  }
  log_info("allocation {} revoked", *id);
  reply(CtlReply{0, fmt::format("allocation {} revoked\n", *id)});
}

void Commands::label_allocation(const Args& args, bool, ReplyHandler reply) {
  auto id = parse_integer(args[0]);
  if (!id || *id <= 0 || allocations_.find(static_cast<std::uint32_t>(*id)) == nullptr) {
    return reply(error_reply(fmt::format("there is no allocation `{}`", args[0])));
  }
  if (!is_kubernetes_name(args[1]) || !is_kubernetes_name(args[2])) {
    return reply(error_reply("label_allocation: namespace and pod are Kubernetes names"));
  }
  allocations_.label(static_cast<std::uint32_t>(*id), args[1], args[2]);
  reply(CtlReply{0, fmt::format("allocation {} is pod {}/{}\n", *id, args[1], args[2])});
}

void Commands::list_allocations(const Args&, bool json, ReplyHandler reply) {
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [id, a] : allocations_.all()) {
      auto text_or_null = [](const std::string& text) {
        return text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text);
      };
      list.push_back(
          {{"allocation", id},
           {"gpus", a.gpus},  // empty: any
           {"sm_percentage", a.sm_percentage == 0 ? 100 : a.sm_percentage},
           {"memory_limit_bytes",
            a.memory_limit == 0 ? nlohmann::json(nullptr) : nlohmann::json(a.memory_limit)},
           {"sm_slot", a.sm_slots == 0 ? nlohmann::json(nullptr) : nlohmann::json(a.sm_slot)},
           {"sm_slots", a.sm_slots == 0 ? nlohmann::json(nullptr) : nlohmann::json(a.sm_slots)},
           {"namespace", text_or_null(a.pod_namespace)},
           {"pod", text_or_null(a.pod_name)},
           {"devices", a.devices}});
    }
    return reply(json_reply(
        0, {{"allocations", std::move(list)}, {"tokens_required", allocations_.tokens_required}}));
  }
  constexpr std::string_view kRow = "{:<7}{:<8}{:<5}{:<10}{:<32}{}\n";
  std::string text = fmt::format(kRow, "ID", "GPUS", "SM%", "MEMORY", "POD", "DEVICES");
  for (const auto& [id, a] : allocations_.all()) {
    text +=
        fmt::format(kRow, id, a.gpus.empty() ? "any" : fmt::format("{}", fmt::join(a.gpus, ",")),
                    a.sm_percentage == 0 ? 100 : a.sm_percentage,
                    a.memory_limit == 0 ? "-" : format_size(a.memory_limit), pod_of(a),
                    a.devices.empty() ? "-" : fmt::format("{}", fmt::join(a.devices, ",")));
  }
  if (allocations_.tokens_required) {
    text += "clients without a token get the defaults (--require-allocation-token)\n";
  }
  reply(CtlReply{0, text});
}

}  // namespace mpsshim::daemon

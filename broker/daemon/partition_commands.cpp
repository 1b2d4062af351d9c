// mpsshimctl sm_partition add|rm and lspart (sm_partitions.hpp). How a GPU splits only its
// server's driver knows (add asks it); which clients run in a partition only the servers know
// (rm and lspart ask them: their ps lines carry partition=).
#include <fmt/format.h>

#include <charconv>
#include <map>
#include <optional>
#include <sstream>

#include "broker/daemon/client_table.hpp"
#include "broker/daemon/commands.hpp"

namespace mpsshim::daemon {
namespace {

std::optional<unsigned long> parse_count(const std::string& text) {
  unsigned long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

CtlReply json_reply(int status, nlohmann::json object) {
  object["ok"] = status == 0;
  return CtlReply{status, object.dump(2, ' ', false, nlohmann::json::error_handler_t::replace),
                  true};
}

nlohmann::json partition_json(const SmPartition& p, const std::vector<long>& pids) {
  return {{"id", p.id},         {"gpu", p.gpu},   {"first_group", p.first_group},
          {"groups", p.groups}, {"sms", p.sms()}, {"granularity", p.granularity},
          {"clients", pids}};
}

// "2-4": the groups of the GPU's split it holds.
std::string group_range(const SmPartition& p) {
  return fmt::format("{}-{}", p.first_group, p.first_group + p.groups - 1);
}

// The server's answer to sm_partition_groups: "groups=N granularity=G".
std::optional<SmGroups> parse_groups(const std::string& text) {
  SmGroups split;
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) continue;
    auto value = parse_count(word.substr(eq + 1));
    if (!value) return std::nullopt;
    if (word.compare(0, eq, "groups") == 0) split.count = static_cast<unsigned>(*value);
    if (word.compare(0, eq, "granularity") == 0) split.granularity = static_cast<unsigned>(*value);
  }
  if (split.granularity == 0) return std::nullopt;
  return split;
}

// Client pids by partition id, from the servers' ps lines.
std::map<std::uint32_t, std::vector<long>> clients_by_partition(
    const std::vector<ServerClients>& servers) {
  std::map<std::uint32_t, std::vector<long>> pids;
  for_each_client(servers, [&](int, const ClientFields& fields) {
    auto partition = fields.find("partition");
    auto pid = fields.find("pid");
    if (partition == fields.end() || pid == fields.end()) return;
    auto id = parse_count(partition->second);
    auto number = parse_count(pid->second);
    if (id && *id != 0 && number) {
      pids[static_cast<std::uint32_t>(*id)].push_back(static_cast<long>(*number));
    }
  });
  return pids;
}

std::string pid_list(const std::vector<long>& pids) {
  std::string text;
  for (long pid : pids) text += fmt::format("{}{}", text.empty() ? "" : ", ", pid);
  return text;
}

}  // namespace

void Commands::sm_partition(const Args& args, bool json, ReplyHandler reply) {
  const std::string& verb = args[0];
  if (verb == "add") {
    if (args.size() != 3) return reply(CtlReply{1, "usage: sm_partition add <gpu> <sm count>"});
    auto gpu = gpu_argument(args[1]);
    if (!gpu) return reply(CtlReply{1, gpu.error()});
    auto sms = parse_count(args[2]);
    if (!sms || *sms == 0 || *sms > 1'000'000) {
      return reply(CtlReply{1, fmt::format("`{}` is not a number of SMs", args[2])});
    }
    // The table changes when the server answered, on this (the event loop's) thread.
    const int on = *gpu;
    const auto count = static_cast<unsigned>(*sms);
    supervisor_.request(
        on, proto::MessageKind::kCtlRequest, "sm_partition_groups", kServerTimeout,
        [this, on, count, json, reply = std::move(reply)](auto answer) {
          if (!answer) return reply(CtlReply{1, fmt::format("GPU {}: {}", on, answer.error())});
          auto split = parse_groups(answer->text);
          if (answer->status != 0 || !split) {
            return reply(CtlReply{1, fmt::format("GPU {}'s server cannot say how its SMs split: {}",
                                                 on, answer->text)});
          }
          auto added = supervisor_.partitions().add(on, count, *split);
          if (!added) return reply(CtlReply{1, "refused: " + added.error()});
          if (json) return reply(json_reply(0, {{"partition", partition_json(*added, {})}}));
          reply(CtlReply{0, fmt::format("partition={} gpu={} groups={} sms={}", added->id,
                                        added->gpu, group_range(*added), added->sms())});
        });
    return;
  }
  if (verb == "rm") {
    if (args.size() != 2) return reply(CtlReply{1, "usage: sm_partition rm <id>"});
    auto id = parse_count(args[1]);
    if (!id || supervisor_.partitions().find(static_cast<std::uint32_t>(*id)) == nullptr) {
      return reply(
          CtlReply{1, fmt::format("no SM partition `{}`; mpsshimctl lspart lists them", args[1])});
    }
    const auto partition = static_cast<std::uint32_t>(*id);
    query_clients("", [this, partition, reply = std::move(reply)](auto clients, auto,
                                                                  auto problems) {
      // A server that did not answer may have clients in it: refused too.
      if (!problems.empty()) {
        return reply(CtlReply{1, fmt::format("refused: cannot tell whether clients run in "
                                             "partition {}: {}",
                                             partition, problems)});
      }
      auto pids = clients_by_partition(clients)[partition];
      if (!pids.empty()) {
        return reply(CtlReply{1, fmt::format("refused: clients run in partition {} (pids {}); "
                                             "end them first (mpsshimctl terminate_client <gpu> "
                                             "<pid>)",
                                             partition, pid_list(pids))});
      }
      supervisor_.partitions().remove(partition);
      reply(CtlReply{0, fmt::format("partition {} removed", partition)});
    });
    return;
  }
  reply(CtlReply{1, "usage: sm_partition add <gpu> <sm count> | sm_partition rm <id>"});
}

void Commands::lspart(const Args&, bool json, ReplyHandler reply) {
  query_clients(
      "", [this, json, reply = std::move(reply)](auto clients, auto notes, auto problems) {
        auto pids = clients_by_partition(clients);
        const int status = problems.empty() ? 0 : 1;
        if (json) {
          nlohmann::json list = nlohmann::json::array();
          for (const SmPartition& p : supervisor_.partitions().all()) {
            list.push_back(partition_json(p, pids[p.id]));
          }
          nlohmann::json object{{"partitions", std::move(list)}};
          if (!(notes + problems).empty()) object["notes"] = notes + problems;
          return reply(json_reply(status, std::move(object)));
        }
        std::string text =
            fmt::format("{:<4} {:<4} {:<7} {:<5} {}\n", "ID", "GPU", "GROUPS", "SMS", "CLIENTS");
        for (const SmPartition& p : supervisor_.partitions().all()) {
          const auto& in = pids[p.id];
          text += fmt::format("{:<4} {:<4} {:<7} {:<5} {}\n", p.id, p.gpu, group_range(p), p.sms(),
                              in.empty() ? std::string("-") : pid_list(in));
        }
        reply(CtlReply{status, text + notes + problems});
      });
}

}  // namespace mpsshim::daemon

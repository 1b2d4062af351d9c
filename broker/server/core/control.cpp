// The control socket to the daemon: client connections, operator requests, hang-up.
#include <sys/epoll.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <sstream>

#include "broker/server/accounting/client_usage.hpp"
#include "broker/server/core/server.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/scheduling/green_context.hpp"
#include "broker/server/scheduling/quota.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/sm_quota_change.hpp"
#include "broker/server/session/suspension.hpp"
#include "common/log.hpp"
#include "proto/text_parts.hpp"

namespace mpsshim::server {
namespace {

template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc{} && at == end && !text.empty();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// On the session's worker: a device memory limit set live. Below what the client uses, its
// allocations are refused until it uses less (MemoryCharge::over_limit).
std::string set_memory_limit(Session& s, std::uint64_t bytes) {
  s.charge.set_limit(bytes, LimitSource::kOperator);
  log_info("{}: device memory limit set by the operator to {}", s.who(),
           bytes == 0 ? std::string("none") : format_bytes(bytes));
  if (bytes == 0) return fmt::format("{}: no device memory limit", s.who());
  if (s.charge.used() > bytes) {
    return fmt::format(
        "{}: device memory limit {}; it uses {}, so its allocations are refused until it uses "
        "less",
        s.who(), format_bytes(bytes), format_bytes(s.charge.used()));
  }
  return fmt::format("{}: device memory limit {} (it uses {})", s.who(), format_bytes(bytes),
                     format_bytes(s.charge.used()));
}

// Operator requests wait this long for each worker's answer.
constexpr auto kOperatorTimeout = std::chrono::milliseconds(2000);
// A suspend or resume copies the client's memory: 40 GiB take seconds (docs/suspend.md).
constexpr auto kSuspendTimeout = std::chrono::milliseconds(300'000);

}  // namespace

std::size_t Server::read_control() {
  std::size_t count = 0;
  proto::Received message;
  while (control_) {
    int rc = proto::receive_message(control_.get(), message);
    if (rc == EAGAIN || rc == EWOULDBLOCK) break;
    if (rc == 0 && message.bytes.empty()) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, control_.get(), nullptr);
      control_.reset();
      shutdown("the daemon closed the control socket");
      break;
    }
    ++count;
    if (rc != 0) {
      log_warn("dropped a message from the daemon: {}", std::strerror(rc));
      continue;
    }
    on_control_message(message);
  }
  return count;
}

void Server::on_control_message(proto::Received& message) {
  proto::HelloHeader header{};
  if (message.bytes.size() < sizeof header) {
    log_warn("dropped a {}-byte message from the daemon", message.bytes.size());
    return;
  }
  std::memcpy(&header, message.bytes.data(), sizeof header);
  if (header.magic != proto::kHelloMagic || header.abi_major != proto::kAbiMajor) {
    log_warn("dropped a message from the daemon with ABI {}.{} (this server is {}.{})",
             header.abi_major, header.abi_minor, proto::kAbiMajor, proto::kAbiMinor);
    return;
  }
  auto kind = static_cast<proto::MessageKind>(header.kind);
  if (kind == proto::MessageKind::kServerAdmit) {
    proto::ServerAdmit admit_message{};
    if (message.bytes.size() != sizeof admit_message || message.fds.size() != 1) {
      log_warn("dropped a malformed client admission ({} bytes, {} fds)", message.bytes.size(),
               message.fds.size());
      return;
    }
    std::memcpy(&admit_message, message.bytes.data(), sizeof admit_message);
    admit(admit_message, std::move(message.fds[0]));
    return;
  }

  proto::TextMessage text_message{};
  const std::size_t text_offset = offsetof(proto::TextMessage, text);
  if (message.bytes.size() < text_offset || message.bytes.size() > sizeof text_message) {
    log_warn("dropped a malformed {}-byte operator message (kind {})", message.bytes.size(),
             header.kind);
    return;
  }
  std::memcpy(&text_message, message.bytes.data(), message.bytes.size());
  std::size_t length =
      std::min<std::size_t>(text_message.length, message.bytes.size() - text_offset);
  std::string text(text_message.text, ::strnlen(text_message.text, length));
  int status = 0;
  switch (kind) {
    case proto::MessageKind::kServerStatsQuery:
      // "" asks for the `ps` fields, "stats" for the per-client accounting (mpsshimctl stats).
      reply_text(proto::MessageKind::kServerStats, 0, stats_text(text == "stats"));
      break;
    case proto::MessageKind::kServerTerminateClient: {
      std::string reply = terminate_client(text, status);
      reply_text(proto::MessageKind::kCtlReply, status, reply);
      break;
    }
    case proto::MessageKind::kCtlRequest: {
      std::string reply = control_command(text, status);
      reply_text(proto::MessageKind::kCtlReply, status, reply);
      break;
    }
    default:
      log_warn("dropped a message of kind {} from the daemon", header.kind);
      break;
  }
}

void Server::reply_text(proto::MessageKind kind, int status, const std::string& text) {
  if (!control_) return;
  // Several messages when it is long (`ps` of many clients): proto/text_parts.hpp.
  for (const proto::TextMessage& part : proto::text_messages(kind, status, text)) {
    if (int rc = proto::send_struct(control_.get(), part); rc != 0) {
      log_warn("could not answer the daemon: {}", std::strerror(rc));
      return;
    }
  }
}

std::string Server::stats_text(bool accounting) {
  std::vector<std::string> parts = on_each_worker(
      [accounting](Worker& worker) {
        std::string lines;
        for (const auto& s : worker.sessions()) {
          // Busy spans that ended since the last pass count now: a client that synchronized
          // sees all its work counted (the span's end precedes its answer).
          poll_busy(*s);
          std::string line = accounting ? format_session_stats(*s) : format_client_usage(*s);
          line.insert(line.size() - 1, fmt::format(" worker={}", worker.index()));
          lines += line;
        }
        return lines;
      },
      kOperatorTimeout);
  std::string out;
  for (const std::string& part : parts) out += part;
  return out;
}

std::string Server::terminate_client(const std::string& text, int& status) {
  int pid = 0;
  if (!parse_number(trim(text), pid)) {
    status = 1;
    return fmt::format("terminate_client: \"{}\" is not a pid", text);
  }
  std::vector<std::string> parts = on_each_worker(
      [pid](Worker& worker) {
        std::vector<std::string> ended;
        for (const auto& s : worker.sessions()) {
          if (s->client.pid != pid || s->life.state != SessionState::kActive) continue;
          ended.push_back(s->who());
          worker.end_session(*s, "was terminated by the operator",
                             CUDA_ERROR_MPS_CLIENT_TERMINATED);
        }
        return fmt::format("{}", fmt::join(ended, ", "));
      },
      kOperatorTimeout);
  std::vector<std::string> ended;
  for (std::string& part : parts) {
    if (!part.empty()) ended.push_back(std::move(part));
  }
  if (ended.empty()) {
    status = 1;
    return fmt::format("no client with pid {} on GPU {}", pid, gpu_.ordinal);
  }
  return fmt::format("terminated {}", fmt::join(ended, ", "));
}

std::string Server::client_quota_command(const std::string& command, const std::string& pid_text,
                                         std::istream& rest, int& status) {
  int pid = 0;
  std::string value;
  rest >> value;
  const bool sms = command == "set_client_active_thread_percentage";
  int percentage = 0;
  std::uint64_t bytes = 0;
  if (!parse_number(std::string_view(pid_text), pid) || pid <= 0 ||
      (sms ? !parse_number(std::string_view(value), percentage) || percentage < 1 ||
                 percentage > 100
           : !parse_number(std::string_view(value), bytes))) {
    status = 1;
    return fmt::format("{}: expected a pid and {}, got \"{} {}\"", command,
                       sms ? "a percentage from 1 to 100" : "a number of bytes (0 = no limit)",
                       pid_text, value);
  }
  // Under --memory-overcommit a raised limit is held to the percentage, as at admission.
  if (!sms) {
    if (std::string why = overcommit_refusal(bytes, pid, kOperatorTimeout); !why.empty()) {
      status = 1;
      return fmt::format("client with pid {} on GPU {}: not changed: {}", pid, gpu_.ordinal, why);
    }
  }
  // Mail to every worker: the session's own worker applies it between two passes.
  std::vector<std::string> parts = on_each_worker(
      // By value: a worker that answers after the timeout must not reach this stack frame.
      [pid, sms, percentage, bytes](Worker& worker) {
        std::string lines;
        for (const auto& s : worker.sessions()) {
          if (s->client.pid != pid || s->life.state != SessionState::kActive) continue;
          if (sms) {
            auto changed = change_sm_quota(*s, percentage);
            lines += changed ? *changed + "\n"
                             : fmt::format("{}: not changed: {}\n", s->who(), changed.error());
            continue;
          }
          lines += set_memory_limit(*s, bytes) + "\n";
        }
        return lines;
      },
      kOperatorTimeout);
  std::string answer;
  for (const std::string& part : parts) answer += part;
  if (answer.empty()) {
    status = 1;
    return fmt::format("no client with pid {} on GPU {}", pid, gpu_.ordinal);
  }
  if (answer.find(": not changed: ") != std::string::npos) status = 1;
  answer.pop_back();
  return answer;
}

std::string Server::suspend_command(const std::string& command, const std::string& pid_text,
                                    int& status) {
  int pid = 0;
  if (!parse_number(std::string_view(pid_text), pid) || pid <= 0) {
    status = 1;
    return fmt::format("{}: expected a pid, got \"{}\"", command, pid_text);
  }
  const bool suspend = command == "suspend_client";
  // The session's own worker suspends or resumes it between two passes.
  std::vector<std::string> parts = on_each_worker(
      [pid, suspend](Worker& worker) {
        std::string lines;
        for (const auto& s : worker.sessions()) {
          if (s->client.pid != pid || s->life.state != SessionState::kActive) continue;
          auto done = suspend ? suspend_session(*s) : resume_session(*s);
          // An allocation that waited for a memory policy is served again once the operator's
          // suspend is over (the coordinator leaves it alone meanwhile).
          if (done && !suspend && s->memory_wait.on && s->memory_arbiter != nullptr) {
            s->memory_arbiter->want(
                MemoryWant{s->client.id, s->memory_wait.bytes, s->priority.below_normal,
                           s->memory_wait.call != MemoryWait::Call::kMemCreate});
          }
          // A refusal is marked for the coordinator by a leading '!'.
          lines += done ? *done + "\n" : "!" + done.error() + "\n";
        }
        return lines;
      },
      kSuspendTimeout);
  std::string answer;
  for (const std::string& part : parts) answer += part;
  if (answer.empty()) {
    status = 1;
    return fmt::format("no client with pid {} on GPU {}", pid, gpu_.ordinal);
  }
  std::string out;
  for (std::size_t at = 0; at < answer.size();) {
    std::size_t end = answer.find('\n', at);
    std::string_view line(answer.data() + at, end - at);
    if (!line.empty() && line.front() == '!') {
      status = 1;
      line.remove_prefix(1);
    }
    out.append(line);
    out.push_back('\n');
    at = end + 1;
  }
  out.pop_back();
  return out;
}

std::string Server::control_command(const std::string& text, int& status) {
  std::istringstream in{std::string(trim(text))};
  std::string command, value;
  in >> command >> value;
  if (command == "set_default_active_thread_percentage") {
    int p = 0;
    if (!parse_number(std::string_view(value), p) || p < 1 || p > 100) {
      status = 1;
      return fmt::format("{}: expected a percentage from 1 to 100, got \"{}\"", command, value);
    }
    settings_.default_sm_percentage = p;
    log_info("default SM share for new clients is now {}%", p);
    return "ok";
  }
  if (command == "set_default_memory_limit") {
    std::uint64_t bytes = 0;
    if (!parse_number(std::string_view(value), bytes)) {
      status = 1;
      return fmt::format("{}: expected a number of bytes (0 = no limit), got \"{}\"", command,
                         value);
    }
    settings_.default_memory_limit = bytes;
    log_info("default memory limit for new clients is now {}",
             bytes == 0 ? std::string("none") : format_bytes(bytes));
    return "ok";
  }
  if (command == "sm_partition_groups") {
    // How the device splits into static SM partitions' groups (mpsshimctl sm_partition add):
    // the count depends on how the GPU's SMs lie in its GPCs, which only the driver knows.
    const proto::DeviceSnapshot& snap = gpu_.snapshot;
    const unsigned granularity =
        sm_granularity(snap.sm_min_partition, snap.sm_coscheduled_alignment, false);
    auto groups = count_sm_groups(*gpu_.cu, gpu_.sm_resource, granularity);
    if (!groups) {
      status = 1;
      return fmt::format("splitting the device's SMs in groups of {} failed: {}", granularity,
                         describe(*gpu_.cu, groups.error()));
    }
    return fmt::format("groups={} granularity={}", *groups, granularity);
  }
  if (command == "set_client_active_thread_percentage" || command == "set_client_memory_limit") {
    return client_quota_command(command, value, in, status);
  }
  if (command == "suspend_client" || command == "resume_client") {
    return suspend_command(command, value, status);
  }
  status = 1;
  return fmt::format("the server does not know the command \"{}\"", command);
}

}  // namespace mpsshim::server

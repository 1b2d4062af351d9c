#include "libshim/nvml/share_view.hpp"

#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "libshim/client.hpp"
#include "libshim/nvml/real_nvml.hpp"
#include "proto/control.hpp"
#include "proto/text_parts.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::nvml {

namespace {

using Clock = std::chrono::steady_clock;

// A daemon that takes longer than this (its servers answer within 2 s) is not waited for.
constexpr int kAnswerTimeoutSeconds = 5;

struct Cache {
  std::mutex mutex;
  Clock::time_point asked{};
  bool ever_asked = false;
  std::optional<std::vector<GpuShare>> view;  // nullopt: the last ask failed
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: NVML may be called from exit handlers
  return *c;
}

std::atomic<bool> unreachable_logged{false};
std::atomic<bool> unlisted_logged{false};

proto::ClientViewRequest make_request(const shim::ClientConfig& config) {
  proto::ClientViewRequest request{};
  request.hello = shim::make_client_hello(proto::MessageKind::kClientView, -1, config);
  request.hello.header.size = sizeof request;
  for (const auto& [ordinal, bytes] : config.memory_limit) {
    if (ordinal >= 0 && ordinal < proto::kViewOrdinals)
      request.memory_limit_by_ordinal[ordinal] = bytes;
  }
  return request;
}

// One ask of the daemon: its JSON, or why not.
std::optional<std::string> ask_daemon(std::string& why) {
  shim::ClientConfig config = shim::read_client_config();
  proto::ClientViewRequest request = make_request(config);
  for (const std::string& path : config.socket_candidates) {
    int fd = proto::connect_seqpacket(path);
    if (fd < 0) {
      why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", path, std::strerror(-fd));
      continue;
    }
    proto::UniqueFd socket(fd);
    timeval timeout{kAnswerTimeoutSeconds, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    if (proto::send_struct(fd, request) != 0) {
      why = fmt::format("{}: cannot send the request", path);
      return std::nullopt;
    }
    proto::TextAssembly answer;
    for (;;) {
      proto::Received reply;
      if (int error = proto::receive_message(fd, reply); error != 0 || reply.bytes.empty()) {
        why = fmt::format("{}: no answer ({})", path,
                          error != 0 ? std::strerror(error) : "the daemon hung up");
        return std::nullopt;
      }
      proto::HelloHeader header{};
      if (reply.bytes.size() < sizeof header) break;
      std::memcpy(&header, reply.bytes.data(), sizeof header);
      if (header.kind == static_cast<std::uint32_t>(proto::MessageKind::kRefused) &&
          reply.bytes.size() >= sizeof(proto::Refused)) {
        proto::Refused refused{};
        std::memcpy(&refused, reply.bytes.data(), sizeof refused);
        refused.message[sizeof refused.message - 1] = '\0';
        why = fmt::format("{} refused: {}", path, refused.message);
        return std::nullopt;
      }
      if (header.kind != static_cast<std::uint32_t>(proto::MessageKind::kClientViewReply) ||
          reply.bytes.size() != sizeof(proto::TextMessage)) {
        break;
      }
      proto::TextMessage part{};
      std::memcpy(&part, reply.bytes.data(), sizeof part);
      if (answer.add(part)) return answer.text();
    }
    why =
        fmt::format("{}: an answer this library cannot read (mpsshimd older than ABI 1.25?)", path);
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::vector<GpuShare>> parse_view(const std::string& text) {
  nlohmann::json view = nlohmann::json::parse(text, nullptr, false);
  if (view.is_discarded() || !view.is_object() || !view.contains("gpus") ||
      !view["gpus"].is_array()) {
    return std::nullopt;
  }
  std::vector<GpuShare> shares;
  try {
    for (const auto& gpu : view["gpus"]) {
      GpuShare share;
      share.uuid = gpu.at("uuid").get<std::string>();
      share.total_memory = gpu.at("memory_total_bytes").get<std::uint64_t>();
      if (!gpu.at("memory_limit_bytes").is_null()) {
        share.memory_limit = gpu["memory_limit_bytes"].get<std::uint64_t>();
      }
      share.memory_used = gpu.at("memory_used_bytes").get<std::uint64_t>();
      share.sms = gpu.at("sms").get<unsigned>();
      if (!gpu.at("busy_percent").is_null()) share.busy_percent = gpu["busy_percent"].get<double>();
      for (const auto& process : gpu.at("processes")) {
        share.processes.push_back(ShareProcess{process.at("pid").get<unsigned>(),
                                               process.at("memory_used_bytes").get<std::uint64_t>(),
                                               process.value("program", std::string())});
      }
      shares.push_back(std::move(share));
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return shares;
}

std::optional<GpuShare> share_of(const std::string& uuid) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  const auto now = Clock::now();
  const auto age = now - c.asked;
  if (!c.ever_asked || (c.view && age >= kRefresh) || (!c.view && age >= kRetryAfterFailure)) {
    std::string why;
    std::optional<std::string> answer = ask_daemon(why);
    c.ever_asked = true;
    c.asked = now;
    c.view = answer ? parse_view(*answer) : std::nullopt;
    if (answer && !c.view) why = "the daemon's answer is not the view this library reads";
    if (!c.view) {
      log_once(unreachable_logged, LogLevel::kWarn,
               "libmpsshim-nvml: cannot ask mpsshimd for this process's share ({}); NVML "
               "answers for the physical GPUs until it can (start mpsshimd, or set "
               "CUDA_MPS_PIPE_DIRECTORY to its runtime directory)",
               why);
    }
  }
  if (!c.view) return std::nullopt;
  for (const GpuShare& share : *c.view) {
    if (share.uuid == uuid) return share;
  }
  log_once(unlisted_logged, LogLevel::kInfo,
           "libmpsshim-nvml: {} is not a GPU this process may use; NVML answers for it as "
           "the physical GPU",
           uuid);
  return std::nullopt;
}

std::optional<GpuShare> share_of_device(Device device) {
  using GetUuid = Return(Device, char*, unsigned);
  auto* get_uuid = real<GetUuid>("nvmlDeviceGetUUID");
  if (get_uuid == nullptr) return std::nullopt;
  char uuid[96] = {};
  if (get_uuid(device, uuid, sizeof uuid) != kSuccess) return std::nullopt;
  return share_of(uuid);
}

}  // namespace mpsshim::nvml

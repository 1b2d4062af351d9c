#include "deviceplugin/plugin.hpp"

#include <fmt/format.h>

#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <tuple>

#include "broker/daemon/ctl_client.hpp"
#include "broker/daemon/log.hpp"

namespace mpsshim::deviceplugin {

namespace {

constexpr auto kDaemonTimeout = std::chrono::seconds(5);
constexpr const char* kHealthy = "Healthy";
constexpr const char* kUnhealthy = "Unhealthy";

// `allocation=7 token=abc…` -> {7, "abc…"}.
std::optional<std::pair<std::uint32_t, std::string>> parse_registration(const std::string& text) {
  std::istringstream words(text);
  std::uint32_t id = 0;
  std::string token;
  for (std::string word; words >> word;) {
    if (word.rfind("allocation=", 0) == 0)
      id = static_cast<std::uint32_t>(std::stoul(word.substr(11)));
    if (word.rfind("token=", 0) == 0) token = word.substr(6);
  }
  if (id == 0 || token.empty()) return std::nullopt;
  return std::make_pair(id, token);
}

// The ids in `list_allocations`' answer (first column; the header and notes are skipped).
std::set<std::uint32_t> listed_ids(const std::string& text) {
  std::set<std::uint32_t> ids;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::uint32_t id = 0;
    if (std::sscanf(line.c_str(), "%u", &id) == 1) ids.insert(id);
  }
  return ids;
}

bool overlaps(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::any_of(a.begin(), a.end(), [&](const std::string& x) {
    return std::find(b.begin(), b.end(), x) != b.end();
  });
}

}  // namespace

DevicePlugin::DevicePlugin(PluginConfig config) : config_(std::move(config)) {}

std::string DevicePlugin::socket_path() const {
  return config_.runtime_dir + "/control";
}

std::string DevicePlugin::daemon_instance() const {
  struct stat st {};
  if (::stat(socket_path().c_str(), &st) != 0) return "";
  return fmt::format("{}:{}.{}", st.st_ino, st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
}

bool DevicePlugin::poll_daemon() {
  auto answer = daemon::ask_daemon(socket_path(), "gpu_states", kDaemonTimeout);
  tl::expected<std::vector<GpuState>, std::string> gpus =
      !answer               ? tl::unexpected(answer.error().message)
      : answer->status != 0 ? tl::unexpected(answer->text)
                            : parse_gpu_states(answer->text);
  {
    std::lock_guard lock(mutex_);
    const bool was_answering = daemon_answered_;
    if (!gpus) {
      if (was_answering || generation_ == 0) {
        log_warn("mpsshimd does not answer ({}); every device is unhealthy until it does",
                 gpus.error());
        daemon_answered_ = false;
        ++generation_;
        changed_.notify_all();
      }
      return false;
    }
    std::vector<Replica> before = replicas_of(config_, gpus_);
    std::vector<Replica> after = replicas_of(config_, *gpus);
    auto same = [](const Replica& a, const Replica& b) {
      return a.id == b.id && a.healthy == b.healthy;
    };
    const bool changed = !was_answering || before.size() != after.size() ||
                         !std::equal(before.begin(), before.end(), after.begin(), same);
    for (const GpuState& gpu : *gpus) {
      auto old = std::find_if(gpus_.begin(), gpus_.end(),
                              [&](const GpuState& g) { return g.index == gpu.index; });
      if (old != gpus_.end() && old->state != gpu.state) {
        log_info("GPU {} ({}) is {} (was {}): its replicas are {}", gpu.index, gpu.uuid, gpu.state,
                 old->state, gpu.healthy() ? kHealthy : kUnhealthy);
      }
    }
    gpus_ = std::move(*gpus);
    daemon_answered_ = true;
    if (changed) {
      ++generation_;
      changed_.notify_all();
    }
  }
  if (auto listed = daemon::ask_daemon(socket_path(), "list_allocations", kDaemonTimeout);
      listed && listed->status == 0) {
    reregister_lost(listed->text);
  }
  name_pods();
  return true;
}

void DevicePlugin::name_pods() {
  {
    std::lock_guard lock(mutex_);
    const bool unnamed = std::any_of(by_token_.begin(), by_token_.end(),
                                     [](const auto& entry) { return entry.second.pod.empty(); });
    if (!unnamed) return;
  }
  struct stat st {};
  if (::stat(config_.pod_resources_socket.c_str(), &st) != 0) return;
  auto stub = v1::PodResourcesLister::NewStub(grpc::CreateChannel(
      "unix:" + config_.pod_resources_socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ListPodResourcesResponse pods;
  if (grpc::Status status = stub->List(&context, v1::ListPodResourcesRequest(), &pods);
      !status.ok()) {
    log_debug("the kubelet's pod-resources API at {} did not answer: {}",
              config_.pod_resources_socket, status.error_message());
    return;
  }
  std::map<std::string, std::pair<std::string, std::string>> holder;  // device -> ns, pod
  for (const auto& pod : pods.pod_resources()) {
    for (const auto& container : pod.containers()) {
      for (const auto& devices : container.devices()) {
        if (devices.resource_name() != config_.resource_name) continue;
        for (const std::string& id : devices.device_ids()) {
          holder[id] = {pod.namespace_(), pod.name()};
        }
      }
    }
  }
  std::vector<std::tuple<std::uint32_t, std::string, std::string>> to_label;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [token, registered] : by_token_) {
      if (!registered.pod.empty() || registered.plan.devices.empty()) continue;
      auto found = holder.find(registered.plan.devices.front());
      if (found == holder.end()) continue;
      to_label.emplace_back(registered.id, found->second.first, found->second.second);
    }
  }
  for (const auto& [id, pod_namespace, pod_name] : to_label) {
    auto answer = daemon::ask_daemon(
        socket_path(), fmt::format("label_allocation {} {} {}", id, pod_namespace, pod_name),
        kDaemonTimeout);
    if (!answer || answer->status != 0) {
      log_warn("could not name the pod of allocation {}: {}", id,
               answer ? answer->text : answer.error().message);
      continue;
    }
    log_info("allocation {} is pod {}/{}", id, pod_namespace, pod_name);
    std::lock_guard lock(mutex_);
    for (auto& [token, registered] : by_token_) {
      if (registered.id == id) registered.pod = pod_namespace + "/" + pod_name;
    }
  }
}

void DevicePlugin::reregister_lost(const std::string& listed) {
  const std::set<std::uint32_t> known = listed_ids(listed);
  const std::string instance = daemon_instance();
  std::vector<std::pair<std::string, AllocationPlan>> lost;
  {
    std::lock_guard lock(mutex_);
    std::erase_if(by_token_, [&](const auto& entry) {
      const Registered& registered = entry.second;
      if (known.contains(registered.id) || registered.daemon != instance) return false;
      log_info("allocation {} of {} was revoked in mpsshimd; not registering it again",
               registered.id, fmt::join(registered.plan.devices, ","));
      return true;
    });
    for (const auto& [token, registered] : by_token_) {
      if (!known.contains(registered.id)) lost.emplace_back(token, registered.plan);
    }
  }
  for (auto& [token, plan] : lost) {
    std::string held = token;
    auto again = register_plan(plan, held);
    if (!again) {
      log_error("could not register allocation of {} again: {}", fmt::join(plan.devices, ","),
                again.error());
      continue;
    }
    log_info("mpsshimd had lost the allocation of {}; registered again as {}",
             fmt::join(plan.devices, ","), again->id);
  }
}

void DevicePlugin::run_poller() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    poll_daemon();
    lock.lock();
    changed_.wait_for(lock, config_.health_interval, [this] { return stopping_; });
  }
}

void DevicePlugin::stop() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  changed_.notify_all();
}

void DevicePlugin::restart() {
  std::lock_guard lock(mutex_);
  stopping_ = false;
  ++generation_;  // a new kubelet connection gets the whole list first anyway
}

std::size_t DevicePlugin::device_count() const {
  std::lock_guard lock(mutex_);
  return replicas_of(config_, gpus_).size();
}

v1beta1::ListAndWatchResponse DevicePlugin::device_list_locked() const {
  v1beta1::ListAndWatchResponse list;
  for (const Replica& replica : replicas_of(config_, gpus_)) {
    v1beta1::Device* device = list.add_devices();
    device->set_id(replica.id);
    device->set_health(daemon_answered_ && replica.healthy ? kHealthy : kUnhealthy);
  }
  return list;
}

grpc::Status DevicePlugin::GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                                  v1beta1::DevicePluginOptions* options) {
  options->set_pre_start_required(false);
  options->set_get_preferred_allocation_available(true);
  return grpc::Status::OK;
}

grpc::Status DevicePlugin::ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                                        grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  std::unique_lock lock(mutex_);
  std::uint64_t sent = 0;
  while (!stopping_ && !context->IsCancelled()) {
    if (sent != generation_) {
      sent = generation_;
      v1beta1::ListAndWatchResponse list = device_list_locked();
      lock.unlock();
      if (!writer->Write(list)) return grpc::Status::OK;  // the kubelet went away
      lock.lock();
      continue;
    }
    // Woken by a change; the timeout notices a cancelled stream.
    changed_.wait_for(lock, std::chrono::milliseconds(500));
  }
  return grpc::Status::OK;
}

grpc::Status DevicePlugin::GetPreferredAllocation(
    grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  std::lock_guard lock(mutex_);
  for (const auto& container : request->container_requests()) {
    // Replicas of one GPU first (one token carries one quota), from the GPU with the most free
    // replicas, after those the kubelet says must be in.
    std::vector<std::string> chosen(container.must_include_deviceids().begin(),
                                    container.must_include_deviceids().end());
    std::map<std::string, std::vector<std::string>> free_by_gpu;
    for (const std::string& id : container.available_deviceids()) {
      if (std::find(chosen.begin(), chosen.end(), id) != chosen.end()) continue;
      const GpuState* gpu = gpu_of_device(gpus_, id);
      free_by_gpu[gpu ? gpu->uuid : ""].push_back(id);
    }
    std::vector<std::vector<std::string>*> order;
    for (auto& [uuid, ids] : free_by_gpu) order.push_back(&ids);
    std::stable_sort(order.begin(), order.end(),
                     [](auto* a, auto* b) { return a->size() > b->size(); });
    for (auto* ids : order) {
      for (const std::string& id : *ids) {
        if (static_cast<int>(chosen.size()) >= container.allocation_size()) break;
        chosen.push_back(id);
      }
    }
    auto* answer = response->add_container_responses();
    for (const std::string& id : chosen) answer->add_deviceids(id);
  }
  return grpc::Status::OK;
}

tl::expected<DevicePlugin::Registered, std::string> DevicePlugin::register_plan(
    const AllocationPlan& plan, std::string& token) {
  auto answer =
      daemon::ask_daemon(socket_path(), registration_command(plan, token), kDaemonTimeout);
  if (!answer) return tl::unexpected(answer.error().message);
  if (answer->status != 0) return tl::unexpected(answer->text);
  auto registration = parse_registration(answer->text);
  if (!registration) {
    return tl::unexpected(fmt::format("unexpected answer from mpsshimd: {}", answer->text));
  }
  token = registration->second;
  Registered registered{registration->first, plan, "", daemon_instance()};
  std::lock_guard lock(mutex_);
  // The daemon replaced every allocation that held one of these devices; so does the plugin.
  std::erase_if(by_token_, [&](const auto& entry) {
    return entry.first != token && overlaps(entry.second.plan.devices, plan.devices);
  });
  by_token_[token] = registered;
  return registered;
}

grpc::Status DevicePlugin::Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                                    v1beta1::AllocateResponse* response) {
  for (const auto& container : request->container_requests()) {
    std::vector<std::string> devices(container.devices_ids().begin(),
                                     container.devices_ids().end());
    tl::expected<AllocationPlan, std::string> plan;
    {
      std::lock_guard lock(mutex_);
      plan = plan_allocation(config_, gpus_, devices);
    }
    if (!plan) {
      log_error("Allocate {}: {}", fmt::join(devices, ","), plan.error());
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, plan.error());
    }
    std::string token;
    auto registered = register_plan(*plan, token);
    if (!registered) {
      log_error("Allocate {}: mpsshimd did not register the allocation: {}",
                fmt::join(devices, ","), registered.error());
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "mpsshimd did not register the allocation: " + registered.error());
    }
    fill_response(config_, *plan, token, *response->add_container_responses());
    log_info("Allocate {}: allocation {} on GPU {}: {}% of the SMs, {} shared",
             fmt::join(devices, ","), registered->id, fmt::join(plan->uuids, ","),
             plan->sm_percentage,
             plan->memory_limit == 0 ? std::string("no memory limit")
                                     : fmt::format("{} bytes", plan->memory_limit));
  }
  return grpc::Status::OK;
}

grpc::Status DevicePlugin::PreStartContainer(grpc::ServerContext*,
                                             const v1beta1::PreStartContainerRequest*,
                                             v1beta1::PreStartContainerResponse*) {
  return grpc::Status::OK;  // not asked for (pre_start_required is false)
}

}  // namespace mpsshim::deviceplugin

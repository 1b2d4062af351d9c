// The device plugin against a test acting as the kubelet, over real gRPC unix sockets: the
// plugin registers on kubelet.sock, the test calls the plugin's socket as the kubelet does
// (ListAndWatch, GetPreferredAllocation, Allocate) and runs a client with what Allocate
// returned, against a real mpsshimd on the test driver. No cluster is involved.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <catch2/catch.hpp>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "deviceplugin/deviceplugin_v1beta1.grpc.pb.h"
#include "deviceplugin/podresources_v1.grpc.pb.h"
#include "tests/e2e/harness.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

constexpr int kReplicas = 4;
constexpr unsigned kSmsOf25Percent = 40;  // test device: ceil(132 * 25%) -> 8-SM groups

// The kubelet's Registration service: remembers what plugins registered.
class FakeKubelet final : public v1beta1::Registration::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    std::lock_guard lock(mutex_);
    requests_.push_back(*request);
    arrived_.notify_all();
    return grpc::Status::OK;
  }
  std::optional<v1beta1::RegisterRequest> wait_for_registration(std::chrono::seconds timeout) {
    std::unique_lock lock(mutex_);
    if (!arrived_.wait_for(lock, timeout, [this] { return !requests_.empty(); })) return {};
    return requests_.front();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<v1beta1::RegisterRequest> requests_;
};

// The kubelet's pod-resources API: one pod holding the devices the test gives it.
class FakePodResources final : public v1::PodResourcesLister::Service {
 public:
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    std::lock_guard lock(mutex_);
    if (devices_.empty()) return grpc::Status::OK;
    auto* pod = response->add_pod_resources();
    pod->set_name("trainer-0");
    pod->set_namespace_("team-a");
    auto* container = pod->add_containers();
    container->set_name("main");
    auto* held = container->add_devices();
    held->set_resource_name("mpsshim.io/gpu");
    for (const auto& id : devices_) held->add_device_ids(id);
    // Another plugin's devices are not ours to name.
    auto* other = container->add_devices();
    other->set_resource_name("example.com/fpga");
    other->add_device_ids("fpga-0");
    return grpc::Status::OK;
  }
  void hold(std::vector<std::string> devices) {
    std::lock_guard lock(mutex_);
    devices_ = std::move(devices);
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> devices_;
};

struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/mpsshim-kubelet-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp");
    path = pattern;
  }
  ~TempDir() { std::system(("rm -rf " + path).c_str()); }
  std::string path;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// GPU 0's server pid, from `mpsshimctl server_list`.
int server_pid(const Daemon& daemon) {
  std::istringstream lines(daemon.ctl({"server_list"}).out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string gpu;
    int pid = -1;
    if (fields >> gpu >> pid && gpu == "0") return pid;
  }
  return -1;
}

std::map<std::string, std::string> envs_of(const v1beta1::ContainerAllocateResponse& response) {
  return {response.envs().begin(), response.envs().end()};
}

}  // namespace

TEST_CASE(
    "the plugin registers, lists replicas, allocates a quota the daemon enforces, and "
    "reports a dead server unhealthy",
    "[deviceplugin]") {
  // --restart-limit 1: the server killed below is given up on, so its GPU stays unhealthy long
  // enough to be seen (a restarted one would be healthy again within 0.1 s).
  Daemon daemon({"--restart-limit", "1"});
  TempDir plugin_dir;
  FakeKubelet kubelet;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + plugin_dir.path + "/kubelet.sock",
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&kubelet);
  FakePodResources pod_resources;
  builder.AddListeningPort("unix:" + plugin_dir.path + "/pod-resources.sock",
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&pod_resources);
  std::unique_ptr<grpc::Server> kubelet_server = builder.BuildAndStart();
  REQUIRE(kubelet_server);
  {
    std::ofstream config(plugin_dir.path + "/sharing.toml");
    config << "replicas = " << kReplicas << "\n"
           << "health_interval_ms = 100\n"
           << "pod_resources_socket = \"" << plugin_dir.path << "/pod-resources.sock\"\n"
           << "shim_library = \"" << artefact("LIBMPSSHIM")
           << "\"\n"
           // The test runs the client on this machine, so "in the container" is here too.
           << "container_shim_library = \"" << artefact("LIBMPSSHIM") << "\"\n"
           << "[[model]]\nmatch = \"no such GPU\"\nreplicas = 7\n";
  }
  Child plugin({artefact("MPSSHIM_DEVICE_PLUGIN"), "--config", plugin_dir.path + "/sharing.toml",
                "--plugin-dir", plugin_dir.path, "--runtime-dir", daemon.dir()},
               {});

  // Register.
  auto registration = kubelet.wait_for_registration(30s);
  REQUIRE(registration);
  CHECK(registration->version() == "v1beta1");
  CHECK(registration->resource_name() == "mpsshim.io/gpu");
  CHECK(registration->endpoint() == "mpsshim.sock");
  CHECK(registration->options().get_preferred_allocation_available());

  auto channel = grpc::CreateChannel("unix:" + plugin_dir.path + "/" + registration->endpoint(),
                                     grpc::InsecureChannelCredentials());
  auto sut = v1beta1::DevicePlugin::NewStub(channel);

  // ListAndWatch: kReplicas healthy replicas of the one test GPU.
  grpc::ClientContext watch_context;
  watch_context.set_deadline(std::chrono::system_clock::now() + 180s);  // no Read waits forever
  auto stream = sut->ListAndWatch(&watch_context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  REQUIRE(stream->Read(&list));
  REQUIRE(list.devices_size() == kReplicas);
  std::vector<std::string> ids;
  for (const auto& device : list.devices()) {
    CHECK(device.health() == "Healthy");
    CHECK(std::regex_match(device.id(), std::regex("GPU-[0-9a-f-]{36}::[0-9]")));
    ids.push_back(device.id());
  }
  const std::string uuid = ids[0].substr(0, ids[0].find("::"));

  // GetPreferredAllocation keeps what must be included.
  {
    grpc::ClientContext context;
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    for (const auto& id : ids) container->add_available_deviceids(id);
    container->add_must_include_deviceids(ids[2]);
    container->set_allocation_size(2);
    v1beta1::PreferredAllocationResponse response;
    REQUIRE(sut->GetPreferredAllocation(&context, request, &response).ok());
    REQUIRE(response.container_responses_size() == 1);
    REQUIRE(response.container_responses(0).deviceids_size() == 2);
    CHECK(response.container_responses(0).deviceids(0) == ids[2]);
  }

  // Allocate one replica: a quarter of the GPU, by token.
  grpc::ClientContext allocate_context;
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(ids[1]);
  v1beta1::AllocateResponse response;
  grpc::Status allocated = sut->Allocate(&allocate_context, request, &response);
  REQUIRE(allocated.ok());
  REQUIRE(response.container_responses_size() == 1);
  const auto& container = response.container_responses(0);
  auto envs = envs_of(container);
  CHECK(envs["LD_PRELOAD"] == artefact("LIBMPSSHIM"));
  CHECK(envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mpsshim");
  CHECK(envs["CUDA_VISIBLE_DEVICES"] == uuid);
  CHECK(envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25");
  CHECK(std::regex_match(envs["MPSSHIM_ALLOCATION_TOKEN"], std::regex("[0-9a-f]{32}")));
  REQUIRE(container.mounts_size() == 2);
  CHECK(container.mounts(0).host_path() == daemon.dir());
  CHECK(container.mounts(0).container_path() == "/run/mpsshim");
  CHECK(container.mounts(0).read_only());
  const std::string shim = artefact("LIBMPSSHIM");
  CHECK(container.mounts(1).host_path() == shim.substr(0, shim.rfind('/')));
  CHECK(contains(daemon.ctl({"list_allocations"}).out, ids[1]));

  // Once the kubelet's pod-resources API shows the pod holding the replica, the plugin names
  // the allocation's pod in mpsshimd.
  pod_resources.hold({ids[1]});
  bool named = false;
  for (int i = 0; i < 200 && !named; ++i) {
    named = contains(daemon.ctl({"list_allocations"}).out, "team-a/trainer-0");
    if (!named) std::this_thread::sleep_for(50ms);
  }
  CHECK(named);

  // A client run with that environment (the runtime dir where this test can reach it) gets the
  // quota even when it asks for the whole GPU.
  envs["CUDA_MPS_PIPE_DIRECTORY"] = daemon.dir();
  envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "100";
  Child client({artefact("E2E_CLIENT"), "quota"}, envs);
  Outcome ran = client.wait(120s);
  INFO("client: " << ran.out << ran.err << "\ndaemon log:\n" << daemon.log());
  REQUIRE(ran.exit_code == 0);
  CHECK(contains(ran.out, "sms=" + std::to_string(kSmsOf25Percent)));

  // Allocating the same replica again (the kubelet gave it to a new pod) revokes the old token.
  {
    grpc::ClientContext context;
    v1beta1::AllocateResponse again;
    REQUIRE(sut->Allocate(&context, request, &again).ok());
    auto old_token = envs["MPSSHIM_ALLOCATION_TOKEN"];
    CHECK(envs_of(again.container_responses(0))["MPSSHIM_ALLOCATION_TOKEN"] != old_token);
    Child stale({artefact("E2E_CLIENT"), "basic", "16"}, envs);
    CHECK(stale.wait(60s).exit_code != 0);
  }

  // The GPU's server dies. A restart may be quicker than the plugin's poll, so it is killed
  // until mpsshimd gives up on the GPU (--restart-limit 1: a server that dies within 10 s of its
  // start is a failed start); the stream must report every replica unhealthy.
  std::thread killer([&daemon] {
    for (int kills = 0; kills < 5; ++kills) {
      int pid = server_pid(daemon);
      if (pid <= 0) return;  // failed: no server any more
      ::kill(pid, SIGKILL);
      for (int i = 0; i < 200 && server_pid(daemon) == pid; ++i) std::this_thread::sleep_for(50ms);
    }
  });
  bool unhealthy = false;
  while (!unhealthy && stream->Read(&list)) {
    unhealthy = list.devices_size() == kReplicas &&
                std::all_of(list.devices().begin(), list.devices().end(),
                            [](const auto& d) { return d.health() == "Unhealthy"; });
  }
  killer.join();
  CHECK(unhealthy);

  watch_context.TryCancel();
  plugin.kill(SIGTERM);
  Outcome stopped = plugin.wait(30s);
  INFO("plugin: " << stopped.out << stopped.err);
  CHECK(stopped.exit_code == 0);
  CHECK(contains(stopped.err, "registered mpsshim.io/gpu with the kubelet"));
  CHECK(contains(stopped.err, "(was running): its replicas are Unhealthy"));
}

TEST_CASE("a bad config is refused with the line and key named", "[deviceplugin]") {
  TempDir dir;
  {
    std::ofstream config(dir.path + "/bad.toml");
    config << "replicas = 0\n";
  }
  Child plugin({artefact("MPSSHIM_DEVICE_PLUGIN"), "--config", dir.path + "/bad.toml"}, {});
  Outcome o = plugin.wait(30s);
  CHECK(o.exit_code == 1);
  CHECK(contains(o.err, "replicas: expected a whole number from 1 to 256"));
}

namespace {

// mpsshimd -d on a directory of the test's, so that it can be stopped and started again there.
Outcome start_daemon(const std::string& runtime_dir) {
  Child daemon({artefact("MPSSHIMD"), "-d", "--runtime-dir", runtime_dir, "--server",
                artefact("MPSSHIM_SERVER"), "--driver", artefact("MPSSHIM_TESTDRIVER"),
                "--log-file", runtime_dir + ".log"},
               {});
  return daemon.wait(60s);
}

Outcome ctl(const std::string& runtime_dir, const std::vector<std::string>& command) {
  std::vector<std::string> argv{artefact("MPSSHIMCTL"), "--runtime-dir", runtime_dir};
  argv.insert(argv.end(), command.begin(), command.end());
  return Child(argv, {}).wait(30s);
}

}  // namespace

TEST_CASE(
    "after mpsshimd restarts the plugin registers its allocations again; one an operator "
    "revoked stays revoked",
    "[deviceplugin]") {
  TempDir dir;
  const std::string runtime = dir.path + "/run";
  Outcome started = start_daemon(runtime);
  INFO("mpsshimd -d: " << started.out << started.err);
  REQUIRE(started.exit_code == 0);
  FakeKubelet kubelet;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + dir.path + "/kubelet.sock", grpc::InsecureServerCredentials());
  builder.RegisterService(&kubelet);
  auto kubelet_server = builder.BuildAndStart();
  REQUIRE(kubelet_server);
  {
    std::ofstream config(dir.path + "/sharing.toml");
    config << "health_interval_ms = 100\n";
  }
  Child plugin({artefact("MPSSHIM_DEVICE_PLUGIN"), "--config", dir.path + "/sharing.toml",
                "--plugin-dir", dir.path, "--runtime-dir", runtime},
               {});
  REQUIRE(kubelet.wait_for_registration(30s));
  auto sut = v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(
      "unix:" + dir.path + "/mpsshim.sock", grpc::InsecureChannelCredentials()));
  std::string device;
  REQUIRE(eventually([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 2s);
    auto stream = sut->ListAndWatch(&context, v1beta1::Empty());
    v1beta1::ListAndWatchResponse list;
    if (!stream->Read(&list) || list.devices_size() == 0) return false;
    device = list.devices(0).id();
    context.TryCancel();
    return true;
  }));
  grpc::ClientContext context;
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(device);
  v1beta1::AllocateResponse response;
  REQUIRE(sut->Allocate(&context, request, &response).ok());
  auto envs = envs_of(response.container_responses(0));
  envs["CUDA_MPS_PIPE_DIRECTORY"] = runtime;
  envs["LD_PRELOAD"] = artefact("LIBMPSSHIM");
  auto run_client = [&] { return Child({artefact("E2E_CLIENT"), "basic", "16"}, envs).wait(60s); };
  REQUIRE(run_client().exit_code == 0);

  // A restart forgets every allocation; the plugin notices the new daemon and registers the
  // pod's token again, so the pod's next process is served.
  REQUIRE(ctl(runtime, {"quit"}).exit_code == 0);
  REQUIRE(eventually([&] { return ctl(runtime, {"server_list"}).exit_code == 2; }));
  Outcome restarted = start_daemon(runtime);
  INFO("mpsshimd -d: " << restarted.out << restarted.err);
  REQUIRE(restarted.exit_code == 0);
  CHECK(eventually([&] { return contains(ctl(runtime, {"list_allocations"}).out, device); }));
  Outcome after_restart = run_client();
  INFO("client: " << after_restart.out << after_restart.err);
  CHECK(after_restart.exit_code == 0);

  // An operator's revocation is not undone.
  std::smatch m;
  std::string listed = ctl(runtime, {"list_allocations"}).out;
  REQUIRE(std::regex_search(listed, m, std::regex("\n([0-9]+) ")));
  REQUIRE(ctl(runtime, {"revoke_allocation", m[1]}).exit_code == 0);
  std::this_thread::sleep_for(500ms);  // five polls of the plugin
  CHECK_FALSE(contains(ctl(runtime, {"list_allocations"}).out, device));
  CHECK(run_client().exit_code != 0);

  plugin.kill(SIGTERM);
  Outcome stopped = plugin.wait(30s);
  CHECK(contains(stopped.err, "mpsshimd had lost the allocation of " + device));
  CHECK(contains(stopped.err, "was revoked in mpsshimd; not registering it again"));
  ctl(runtime, {"quit"});
}

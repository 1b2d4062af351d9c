// kubelet_cli: plays the kubelet's part for one Allocate, for trying the device plugin by hand
// (tests/gpu/k8s_allocation.sh): serves Registration on <plugin dir>/kubelet.sock, waits for
// mpsshim-device-plugin to register, reads its device list and asks it to Allocate the first
// N healthy devices. Prints what a container would get, one item a line:
//   ENV <name>=<value>
//   MOUNT <host path> <container path> <ro|rw>
// Exit status: 0 allocated, 1 anything else (said on stderr).
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "deviceplugin/deviceplugin_v1beta1.grpc.pb.h"

namespace {

class Registrations final : public v1beta1::Registration::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    std::lock_guard lock(mutex_);
    endpoint_ = request->endpoint();
    arrived_.notify_all();
    return grpc::Status::OK;
  }
  std::string wait(std::chrono::seconds timeout) {
    std::unique_lock lock(mutex_);
    arrived_.wait_for(lock, timeout, [this] { return !endpoint_.empty(); });
    return endpoint_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::string endpoint_;
};

int fail(const std::string& why) {
  std::fprintf(stderr, "kubelet_cli: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: kubelet_cli <plugin dir> <devices>");
  const std::string dir = argv[1];
  const int wanted = std::atoi(argv[2]);
  Registrations registrations;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + dir + "/kubelet.sock", grpc::InsecureServerCredentials());
  builder.RegisterService(&registrations);
  auto server = builder.BuildAndStart();
  if (!server) return fail("cannot serve on " + dir + "/kubelet.sock");
  const std::string endpoint = registrations.wait(std::chrono::seconds(60));
  if (endpoint.empty()) return fail("no device plugin registered within 60 s");

  auto plugin = v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + dir + "/" + endpoint, grpc::InsecureChannelCredentials()));
  grpc::ClientContext watch;
  watch.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = plugin->ListAndWatch(&watch, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  if (!stream->Read(&list)) return fail("ListAndWatch sent no device list");
  watch.TryCancel();

  v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (const auto& device : list.devices()) {
    if (container->devices_ids_size() < wanted && device.health() == "Healthy") {
      container->add_devices_ids(device.id());
    }
  }
  if (container->devices_ids_size() < wanted) return fail("not enough healthy devices");
  grpc::ClientContext context;
  v1beta1::AllocateResponse response;
  if (grpc::Status status = plugin->Allocate(&context, request, &response); !status.ok()) {
    return fail("Allocate failed: " + status.error_message());
  }
  for (const auto& [name, value] : response.container_responses(0).envs()) {
    std::printf("ENV %s=%s\n", name.c_str(), value.c_str());
  }
  for (const auto& mount : response.container_responses(0).mounts()) {
    std::printf("MOUNT %s %s %s\n", mount.host_path().c_str(), mount.container_path().c_str(),
                mount.read_only() ? "ro" : "rw");
  }
  server->Shutdown();
  return 0;
}

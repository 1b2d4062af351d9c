// The device plugin itself: the DevicePlugin gRPC service the kubelet calls, and the state it
// answers from.
//
// Threads and ownership: gRPC's threads run the service methods; one poller thread (run_poller)
// asks mpsshimd for its GPUs every health_interval. Everything below `mutex_` is shared by them
// and read or written only under it; ListAndWatch streams wait on `changed_` for a new
// generation of the device list.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "deviceplugin/allocation_plan.hpp"
#include "deviceplugin/config.hpp"
#include "deviceplugin/deviceplugin_v1beta1.grpc.pb.h"
#include "deviceplugin/inventory.hpp"
#include "deviceplugin/podresources_v1.grpc.pb.h"

namespace mpsshim::deviceplugin {

class DevicePlugin final : public v1beta1::DevicePlugin::Service {
 public:
  explicit DevicePlugin(PluginConfig config);

  // Asks mpsshimd once: GPUs and their health; allocations it lost (a restart) are registered
  // again with the tokens the pods hold. Returns whether the daemon answered.
  bool poll_daemon();
  // poll_daemon every health_interval until stop().
  void run_poller();
  // Ends the poller and every ListAndWatch stream.
  void stop();
  // After stop(), before run_poller() again (the plugin serves again after a kubelet restart).
  void restart();
  std::size_t device_count() const;

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* options) override;
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override;
  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override;
  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override;

 private:
  struct Registered {
    std::uint32_t id = 0;  // mpsshimd's allocation id
    AllocationPlan plan;
    std::string pod;     // "namespace/name" once the kubelet said (label_allocation sent)
    std::string daemon;  // daemon_instance() when registered
  };

  std::string socket_path() const;
  // Which mpsshimd answers: its control socket's inode and change time. A daemon that
  // restarted has made a new socket (and forgotten every allocation); one that did not, but
  // lists an allocation no more, had it revoked by an operator.
  std::string daemon_instance() const;
  v1beta1::ListAndWatchResponse device_list_locked() const;
  // Registers `plan` (again, with `token` when the pod already holds one); the token.
  tl::expected<Registered, std::string> register_plan(const AllocationPlan& plan,
                                                      std::string& token);
  void reregister_lost(const std::string& listed);
  // Asks the kubelet's pod-resources API which pods hold this plugin's devices and names the
  // allocations' pods in mpsshimd (label_allocation).
  void name_pods();

  const PluginConfig config_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t generation_ = 0;  // bumped whenever the device list or its health changes
  std::vector<GpuState> gpus_;
  bool daemon_answered_ = false;
  std::map<std::string, Registered> by_token_;  // what this plugin registered, by token
  bool stopping_ = false;
};

}  // namespace mpsshim::deviceplugin

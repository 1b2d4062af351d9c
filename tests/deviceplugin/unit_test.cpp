// The device plugin's config, inventory and allocation plans, without processes.
#include <catch2/catch.hpp>

#include "deviceplugin/allocation_plan.hpp"
#include "deviceplugin/config.hpp"
#include "deviceplugin/inventory.hpp"

using namespace mpsshim::deviceplugin;

namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr const char* kTwoGpus =
    "gpu=0 state=running restarts=0 uuid=GPU-aaaa memory=85899345920 sms=132 name=NVIDIA H100 "
    "80GB HBM3\n"
    "gpu=1 state=restarting restarts=1 uuid=GPU-bbbb memory=42949672960 sms=108 name=NVIDIA A100 "
    "40GB\n";

}  // namespace

TEST_CASE("the sharing config: defaults, per-model tables, errors naming the key", "[config]") {
  auto sut = parse_config(R"(
replicas = 4
[[model]]
match = "H100"
replicas = 8
[[model]]
match = "A100"
sm_percentage = 50
memory_limit = "10G"
)");
  REQUIRE(sut);
  GpuShare h100 = share_for(*sut, "NVIDIA H100 80GB HBM3", 80 * kGiB);
  CHECK(h100.replicas == 8);
  CHECK(h100.sm_percentage == 13);  // ceil(100 / 8)
  CHECK(h100.memory_limit == 10 * kGiB);
  GpuShare a100 = share_for(*sut, "NVIDIA A100 40GB", 40 * kGiB);
  CHECK(a100.replicas == 4);
  CHECK(a100.sm_percentage == 50);
  CHECK(a100.memory_limit == 10 * kGiB);
  GpuShare other = share_for(*sut, "NVIDIA L4", 24 * kGiB);
  CHECK(other.replicas == 4);
  CHECK(other.sm_percentage == 25);

  CHECK(parse_config("replicas = 0").error() == "replicas: expected a whole number from 1 to 256");
  CHECK(parse_config("resource_name = \"gpu\"").error().find("needs a domain") !=
        std::string::npos);
  CHECK(parse_config("replica = 3").error() == "unknown key `replica`");
  CHECK_FALSE(parse_config("")->isolate_allocations);
  CHECK(parse_config("isolation = \"allocation\"")->isolate_allocations);
  CHECK_FALSE(parse_config("isolation = \"shared\"")->isolate_allocations);
  CHECK(parse_config("isolation = \"pod\"").error() ==
        "isolation: expected \"shared\" or \"allocation\"");
  CHECK(parse_config("replicas = [").error().find("line 1") != std::string::npos);
  CHECK(parse_config("[[model]]\nreplicas = 2").error().find("needs match") != std::string::npos);
}

TEST_CASE("replicas of running GPUs are healthy, the others not", "[inventory]") {
  auto gpus = parse_gpu_states(kTwoGpus);
  REQUIRE(gpus);
  REQUIRE(gpus->size() == 2);
  CHECK((*gpus)[0].name == "NVIDIA H100 80GB HBM3");
  PluginConfig config;
  config.sharing.replicas = 2;
  std::vector<Replica> sut = replicas_of(config, *gpus);
  REQUIRE(sut.size() == 4);
  CHECK(sut[0].id == "GPU-aaaa::0");
  CHECK(sut[0].healthy);
  CHECK(sut[3].id == "GPU-bbbb::1");
  CHECK(!sut[3].healthy);
  CHECK(!parse_gpu_states("nonsense\n"));
}

TEST_CASE("a plan's quota is a replica's share times the replicas on its GPU", "[plan]") {
  auto gpus = parse_gpu_states(kTwoGpus);
  PluginConfig config;  // 4 replicas: 25% and a quarter of the memory each
  auto two = plan_allocation(config, *gpus, {"GPU-aaaa::0", "GPU-aaaa::3"});
  REQUIRE(two);
  CHECK(two->gpus == std::vector<int>{0});
  CHECK(two->sm_percentage == 50);
  CHECK(two->memory_limit == 40 * kGiB);
  CHECK(registration_command(*two) ==
        "register_allocation sm=50 gpus=0 devices=GPU-aaaa::0,GPU-aaaa::3 memory=42949672960 "
        "slot=0/4");
  PluginConfig isolating = config;
  isolating.isolate_allocations = true;
  auto own = plan_allocation(isolating, *gpus, {"GPU-aaaa::1"});
  REQUIRE(own);
  CHECK(registration_command(*own, "0123") ==
        "register_allocation sm=25 gpus=0 devices=GPU-aaaa::1 memory=21474836480 slot=1/4 "
        "isolation=own token=0123");
  auto third = plan_allocation(config, *gpus, {"GPU-aaaa::2"});
  REQUIRE(third);
  CHECK(third->slot == 2);
  CHECK(third->slots == 4);

  v1beta1::ContainerAllocateResponse response;
  fill_response(config, *two, "0123", response);
  CHECK(response.envs().at("CUDA_VISIBLE_DEVICES") == "GPU-aaaa");
  CHECK(response.envs().at("MPSSHIM_ALLOCATION_TOKEN") == "0123");
  CHECK(response.envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "40G");
  CHECK(response.mounts_size() == 2);
  CHECK(response.mounts(1).container_path() == "/usr/lib/mpsshim");
  config.preload_libraries = {"libfmt.so.9"};
  v1beta1::ContainerAllocateResponse with_fmt;
  fill_response(config, *two, "0123", with_fmt);
  CHECK(with_fmt.envs().at("LD_PRELOAD") ==
        "/usr/lib/mpsshim/libfmt.so.9:/usr/lib/mpsshim/libmpsshim.so");

  CHECK(!plan_allocation(config, *gpus, {"GPU-cccc::0"}));
}

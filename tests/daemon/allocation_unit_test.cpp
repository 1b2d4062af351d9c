// Allocations and the quota decided from them (broker/daemon/allocations.hpp,
// allocation_quota.hpp), without processes.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cstring>

#include "broker/daemon/allocation_quota.hpp"
#include "broker/daemon/allocations.hpp"
#include "broker/daemon/metrics.hpp"

using namespace mpsshim;
using namespace mpsshim::daemon;

namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

proto::ClientHello hello_with(const std::string& token, int percentage = proto::kUnset,
                              std::uint64_t memory = 0) {
  proto::ClientHello hello{};
  hello.active_thread_percentage = percentage;
  hello.device_memory_limit = memory;
  std::strncpy(hello.allocation_token, token.c_str(), sizeof hello.allocation_token - 1);
  return hello;
}

}  // namespace

TEST_CASE("a registered allocation has a fresh 128-bit token and its quota", "[allocation]") {
  AllocationRegistry sut;
  auto a = sut.add({"sm=25", "memory=4G", "gpus=0", "devices=GPU-x::0", "namespace=ns", "pod=p"});
  auto b = sut.add({"sm=25"});
  REQUIRE(a);
  REQUIRE(b);
  CHECK((*a)->token.size() == AllocationRegistry::kTokenHexDigits);
  CHECK((*a)->token != (*b)->token);
  CHECK((*a)->memory_limit == 4 * kGiB);
  CHECK(pod_of(**a) == "ns/p");
  CHECK(sut.find_token((*a)->token) == sut.find((*a)->id));
  CHECK(sut.find_token("0123456789abcdef0123456789abcdef") == nullptr);
}

TEST_CASE("registering a device again replaces its earlier allocation", "[allocation]") {
  AllocationRegistry sut;
  auto first = sut.add({"sm=25", "devices=GPU-x::0,GPU-x::1"});
  REQUIRE(first);
  const std::string old_token = (*first)->token;
  auto second = sut.add({"sm=50", "devices=GPU-x::1"});
  REQUIRE(second);
  CHECK(sut.find_token(old_token) == nullptr);
  CHECK(sut.all().size() == 1);
}

TEST_CASE("a bad registration is refused with the word that is wrong", "[allocation]") {
  AllocationRegistry sut;
  CHECK(sut.add({"sm=0"}).error() == "sm=0: expected a percentage 1-100");
  CHECK(sut.add({"memory=lots"}).error().find("memory=lots") != std::string::npos);
  CHECK(sut.add({"pod=a b"}).error().find("pod") != std::string::npos);
  CHECK(sut.add({"color=red"}).error().find("unknown key `color`") != std::string::npos);
  CHECK(sut.add({"token=xyz"}).error().find("hex digits") != std::string::npos);
  CHECK(sut.all().empty());
}

TEST_CASE("a token's quota caps what the client asks and fills in what it does not",
          "[allocation]") {
  AllocationRegistry registry;
  ServerDefaults defaults;
  auto a = registry.add({"sm=25", "memory=4G", "gpus=0"});
  REQUIRE(a);

  auto asked_more = decide_quota(registry, defaults, hello_with((*a)->token, 100, 8 * kGiB), 0);
  REQUIRE(asked_more);
  CHECK(asked_more->hello.active_thread_percentage == 25);
  CHECK(asked_more->hello.device_memory_limit == 4 * kGiB);
  CHECK(asked_more->allocation_id == (*a)->id);
  CHECK(asked_more->allocation_memory_limit == 4 * kGiB);
  CHECK(asked_more->clamps.size() == 2);

  auto asked_nothing = decide_quota(registry, defaults, hello_with((*a)->token), 0);
  REQUIRE(asked_nothing);
  CHECK(asked_nothing->hello.active_thread_percentage == 25);
  CHECK(asked_nothing->hello.device_memory_limit == 4 * kGiB);
  CHECK(asked_nothing->clamps.empty());

  auto asked_less = decide_quota(registry, defaults, hello_with((*a)->token, 10, kGiB), 0);
  REQUIRE(asked_less);
  CHECK(asked_less->hello.active_thread_percentage == 10);
  CHECK(asked_less->hello.device_memory_limit == kGiB);

  auto other_gpu = decide_quota(registry, defaults, hello_with((*a)->token), 1);
  REQUIRE(!other_gpu);
  CHECK(other_gpu.error().find("holds GPU 0, not GPU 1") != std::string::npos);

  auto forged = decide_quota(registry, defaults, hello_with("f00d"), 0);
  REQUIRE(!forged);
}

TEST_CASE("without a token a client gets what it asks, unless the node requires tokens",
          "[allocation]") {
  AllocationRegistry registry;
  ServerDefaults defaults;
  defaults.sm_percentage = 20;
  defaults.memory_limit = 2 * kGiB;

  auto free_node = decide_quota(registry, defaults, hello_with("", 100, 8 * kGiB), 0);
  REQUIRE(free_node);
  CHECK(free_node->hello.active_thread_percentage == 100);
  CHECK(free_node->allocation_id == 0);

  registry.tokens_required = true;
  auto strict_node = decide_quota(registry, defaults, hello_with("", 100, 8 * kGiB), 0);
  REQUIRE(strict_node);
  CHECK(strict_node->hello.active_thread_percentage == 20);
  CHECK(strict_node->hello.device_memory_limit == 2 * kGiB);
  CHECK(strict_node->clamps.size() == 2);
}

TEST_CASE("ps lines of an allocation's clients get its pod, for the metrics", "[allocation]") {
  AllocationRegistry registry;
  auto a = registry.add({"sm=25", "namespace=team", "pod=trainer"});
  REQUIRE(a);
  const std::string ps = fmt::format(
      "client=1 pid=10 allocation={}\nclient=2 pid=11 allocation=0\nclient=3 pid=12\n", (*a)->id);

  std::string sut = with_pod_fields(registry, ps);

  CHECK(sut == fmt::format("client=1 pid=10 allocation={} namespace=team pod=trainer\n"
                           "client=2 pid=11 allocation=0\nclient=3 pid=12\n",
                           (*a)->id));
}

TEST_CASE("the metrics of an allocation's client carry its allocation, namespace and pod",
          "[allocation][metrics]") {
  MetricsInput input;
  ServerStatus running;
  running.state = ServerState::kRunning;
  input.servers = {running};
  input.reports.ps = {{0,
                       "client=3 pid=7 uid=x program=p mem_used=10 launches=1 allocation=5 "
                       "namespace=team pod=trainer\n"
                       "client=4 pid=8 uid=x program=q mem_used=20 launches=2 allocation=0\n"}};

  std::string sut = format_metrics(input);

  CHECK(sut.find("mpsshim_client_memory_used_bytes{gpu=\"0\",client=\"3\",pid=\"7\",user=\"x\","
                 "program=\"p\",allocation=\"5\",namespace=\"team\",pod=\"trainer\"} 10\n") !=
        std::string::npos);
  CHECK(sut.find("mpsshim_client_memory_used_bytes{gpu=\"0\",client=\"4\",pid=\"8\",user=\"x\","
                 "program=\"q\"} 20\n") != std::string::npos);
}

// The client view's arithmetic (broker/daemon/client_view.hpp) on made-up `ps` answers: who is in
// the scope, what it holds, which pids it may see, and busy time over a window.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "broker/daemon/client_view.hpp"

using namespace mpsshim::daemon;

namespace {

ViewContext context_for(ViewScope scope) {
  ViewContext context;
  context.scope = std::move(scope);
  context.gpus = {ViewGpu{0, 0, "GPU-a", 80ull << 30, 132, 1ull << 30, 50},
                  ViewGpu{1, 1, "GPU-b", 80ull << 30, 132, 0, 25}};
  // pid 30 lives in another pid namespace: counted, not listed.
  context.visible_pid = [](long pid) -> std::optional<long> {
    if (pid == 30) return std::nullopt;
    return pid;
  };
  context.cgroup_of = [](long pid) { return pid < 20 ? std::string("/job-a") : "/job-b"; };
  return context;
}

const std::vector<ServerClients> kPs{
    {0,
     "client=1 pid=10 program=a sms=66 mem_used=1000 busy_us=1000 allocation=0 state=active\n"
     "client=2 pid=11 program=b sms=40 mem_used=500 busy_us=2000 allocation=7 state=active\n"
     "client=3 pid=30 program=c sms=66 mem_used=300 busy_us=0 allocation=7 state=active\n"
     "client=4 pid=21 program=d sms=66 mem_used=700 busy_us=0 allocation=0 state=draining\n"},
    {1, "client=1 pid=12 program=e sms=33 mem_used=64 busy_us=- allocation=0 state=active\n"},
};

}  // namespace

TEST_CASE("a cgroup's view holds its clients' memory and lists the pids it can see",
          "[client_view]") {
  nlohmann::json view = build_client_view(context_for({0, "", "/job-a"}), kPs, {});
  REQUIRE(view["gpus"].size() == 2);
  const auto& a = view["gpus"][0];
  CHECK(a["uuid"] == "GPU-a");
  CHECK(a["memory_limit_bytes"] == 1ull << 30);
  CHECK(a["memory_used_bytes"] == 1500);  // pids 10 and 11 (pid 11's allocation is not asked)
  CHECK(a["processes"].size() == 2);
  CHECK(a["sms"] == 66);
  CHECK(a["busy_percent"].is_null());  // no window measured
  const auto& b = view["gpus"][1];
  CHECK(b["memory_limit_bytes"].is_null());
  CHECK(b["memory_used_bytes"] == 64);
  CHECK(view["scope"] == "cgroup /job-a");
}

TEST_CASE(
    "an allocation's view counts its hidden and draining clients but lists only the live "
    "ones it can see",
    "[client_view]") {
  nlohmann::json view = build_client_view(context_for({7, "ns/pod", "/job-a"}), kPs, {});
  const auto& a = view["gpus"][0];
  CHECK(a["memory_used_bytes"] == 800);  // pids 11 and 30
  REQUIRE(a["processes"].size() == 1);
  CHECK(a["processes"][0]["pid"] == 11);
  CHECK(a["sms"] == 66);
  // GPU 1 has none of the allocation's clients: what its quota would give one, and idle.
  const auto& b = view["gpus"][1];
  CHECK(b["memory_used_bytes"] == 0);
  CHECK(b["sms"] == 33);  // 25% of 132
  CHECK(b["busy_percent"] == 0.0);
  CHECK(view["scope"] == "allocation 7 (ns/pod)");

  ViewContext draining = context_for({0, "", "/job-b"});
  nlohmann::json b_view = build_client_view(draining, kPs, {});
  CHECK(b_view["gpus"][0]["memory_used_bytes"] == 700 + 300);  // pid 21 (draining) and 30
  CHECK(b_view["gpus"][0]["processes"].empty());
}

TEST_CASE("busy time is measured over the window between two readings", "[client_view]") {
  BusySampler sampler;
  const auto t0 = BusySampler::Clock::now();
  std::vector<ServerClients> first{
      {0, "client=1 pid=10 mem_used=0 busy_us=1000 allocation=0 state=active\n"}};
  CHECK(sampler.needs_reading(first, t0));
  BusySampler::Deltas none = sampler.take(first, t0);
  CHECK(none.window.empty());
  const auto t1 = t0 + std::chrono::milliseconds(200);
  CHECK_FALSE(sampler.needs_reading(first, t1));
  std::vector<ServerClients> second{
      {0,
       "client=1 pid=10 mem_used=0 busy_us=101000 allocation=0 state=active\n"
       "client=2 pid=11 mem_used=0 busy_us=50000 allocation=0 state=active\n"}};
  BusySampler::Deltas deltas = sampler.take(second, t1);
  REQUIRE(deltas.window.contains(0));
  CHECK(deltas.window[0] == std::chrono::milliseconds(200));
  nlohmann::json view = build_client_view(context_for({0, "", "/job-a"}), second, deltas);
  // (100 000 + 50 000) µs busy in 200 000 µs.
  CHECK(view["gpus"][0]["busy_percent"].get<double>() == Approx(75.0));
  // A reading after kMaxWindow measures nothing: stale.
  CHECK(sampler.needs_reading(second, t1 + BusySampler::kMaxWindow + std::chrono::seconds(1)));
  // Busy time off (busy_us=-): no reading is waited for.
  CHECK_FALSE(sampler.needs_reading({{1, "client=1 pid=12 busy_us=- state=active\n"}}, t1));
}

TEST_CASE("a process's cgroup identity is known while it lives, the same for its child",
          "[client_view]") {
  const std::string mine = cgroup_identity(::getpid());
  CHECK_FALSE(mine.empty());
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[1]);
    char byte = 0;
    (void)::read(ready[0], &byte, 1);  // until the test closes its end
    ::_exit(0);
  }
  ::close(ready[0]);
  CHECK(cgroup_identity(child) == mine);
  ::close(ready[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(cgroup_identity(0x7ffffff0).empty());  // no such process
}

TEST_CASE("a pid is shown as the asking process sees it", "[client_view]") {
  const long self = ::getpid();
  // Both in this test's pid namespace: the pid itself.
  CHECK(pid_seen_by(self, self) == self);
  // A pid that does not exist is not shown.
  CHECK_FALSE(pid_seen_by(0x7ffffff0, self).has_value());
}

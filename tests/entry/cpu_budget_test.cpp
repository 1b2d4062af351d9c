// libshim/cpu_budget: a cgroup's CPU quota read as whole CPUs, and the figure the copy helpers
// are sized from.
#include <sched.h>

#include <catch2/catch.hpp>

#include "libshim/cpu_budget.hpp"

namespace mpsshim::shim {

TEST_CASE("a cgroup CPU quota counts as the CPUs it allows, rounded up", "[cpu_budget]") {
  CHECK(cpus_of_cpu_max("max 100000") == 0);
  CHECK(cpus_of_cpu_max("100000 100000") == 1);
  CHECK(cpus_of_cpu_max("150000 100000\n") == 2);
  CHECK(cpus_of_cpu_max("400000 100000") == 4);
  CHECK(cpus_of_cpu_max("50000 100000") == 1);
  CHECK(cpus_of_cpu_max("") == 0);
  CHECK(cpus_of_cpu_max("garbage") == 0);
  CHECK(cpus_of_cpu_max("12x 100000") == 0);
  CHECK(cpus_of_cfs_quota(-1, 100000) == 0);  // cgroup v1: no quota
  CHECK(cpus_of_cfs_quota(250000, 100000) == 3);
  CHECK(cpus_of_cfs_quota(100000, 0) == 0);
}

TEST_CASE("the usable CPUs are at least one and at most the affinity's", "[cpu_budget]") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  CHECK(usable_cpus() >= 1);
  CHECK(usable_cpus() <= CPU_COUNT(&set));
}

}  // namespace mpsshim::shim

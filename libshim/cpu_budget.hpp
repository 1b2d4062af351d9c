// How many CPUs this process may keep busy: the CPUs it may run on (sched_getaffinity), fewer
// when its cgroup caps its CPU time (a container's or a Kubernetes pod's CPU limit: cgroup v2
// cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us). Threads past the quota do not run in
// parallel; they make the whole process wait for its next period. Used to size the copy helpers
// (copy_pool.hpp).
#pragma once

#include <string_view>

namespace mpsshim::shim {

// At least 1.
int usable_cpus();

// The CPUs a quota allows, rounded up; 0 for none ("max", a negative quota) or unreadable text.
// cpu.max holds "QUOTA PERIOD" or "max PERIOD".
int cpus_of_cpu_max(std::string_view cpu_max);
int cpus_of_cfs_quota(long quota_us, long period_us);

}  // namespace mpsshim::shim

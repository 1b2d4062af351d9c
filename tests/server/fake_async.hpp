// The fake driver's host functions and memory pools (fake_async.cpp): host functions are queued,
// not run, so a test runs them as the driver's callback thread would; pools keep what they hold.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "broker/server/driver/driver_table.hpp"

namespace mpsshim::server::test {

struct FakeAsync {
  struct HostWork {
    CUstream stream;
    std::function<void(CUresult)> run;  // the driver calling the server's host function
  };
  std::vector<HostWork> host_work;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;

  struct Pool {
    CUmemPoolProps props;
    std::uint64_t used = 0;
    std::uint64_t release_threshold = 0;
    bool destroyed = false;
  };
  std::map<CUmemoryPool, Pool> pools;
  std::map<CUdeviceptr, CUmemoryPool> pool_of;  // live pool allocations
  int pools_live = 0;
  int frees_async = 0;

  void reset() { *this = FakeAsync{}; }
};

FakeAsync& fake_async();
void add_async_fakes(DriverTable& table);

}  // namespace mpsshim::server::test

// cuProfilerStart / cuProfilerStop (cudaProfilerStart, torch.cuda.profiler): they switch the
// attached profiling tool's collection on and off, and without a tool they do nothing and
// succeed. Under the shim a client's kernels run in the server process, where a tool such as
// Nsight Systems must be attached instead; in the client these calls therefore do what they do
// with no tool attached: succeed with a current context, CUDA_ERROR_INVALID_CONTEXT without.
#include <cuda.h>
#include <cudaProfiler.h>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)

namespace {

CUresult profiler_switch(const char* name) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  log_once("profiler.switch", LogLevel::kInfo,
           "{}: the client's GPU work runs in mpsshim-server; attach the profiler to that "
           "process to see it (the call succeeds here, as with no profiler attached)",
           name);
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuProfilerStart() {
  return profiler_switch("cuProfilerStart");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuProfilerStop() {
  return profiler_switch("cuProfilerStop");
}

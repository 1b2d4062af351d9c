// Kernels that observe or break the execution environment: SM placement and fault containment.
#include "device_clock.cuh"

namespace {
// Each block stays resident this long, so the block scheduler has to spread the grid over every
// SM it may use instead of refilling a few SMs with blocks that finish at once.
constexpr long long kResidentNs = 20000;
}  // namespace

extern "C" __global__ void record_smid(unsigned int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = sm_id();
  spin_for_ns(kResidentNs);
}

// The host passes an unmapped address (NULL by default); the store makes the context's work fail
// with CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error.
extern "C" __global__ void trigger_fault(int* p) {
  if (threadIdx.x == 0) *reinterpret_cast<volatile int*>(p) = 0x0badf00d;
}

// Kernels whose only effect is time: launch-overhead and overlap measurements.
#include "device_clock.cuh"

extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void spin_kernel(long long nanoseconds) {
  spin_for_ns(nanoseconds);
}

// Sleeps without occupying the issue slots: other work may overlap it on the same SMs.
extern "C" __global__ void sleep_kernel(int microseconds) {
  const unsigned long long start = global_timer_ns();
  const long long duration_ns = 1000LL * microseconds;
  while (static_cast<long long>(global_timer_ns() - start) < duration_ns) __nanosleep(1000);
}

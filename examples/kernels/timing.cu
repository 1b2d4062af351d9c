// Kernels whose only effect is time: launch-overhead and overlap measurements.
#include "device_clock.cuh"

extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void spin_kernel(long long nanoseconds) {
  spin_for_ns(nanoseconds);
}

// spin_kernel that also records when it ran: block 0's first thread writes its start and end
// (%globaltimer) to stamps[2 * index] and stamps[2 * index + 1]. small_kernels --gaps reads
// them to place the GPU's idle time between one stream's kernels.
extern "C" __global__ void spin_stamp_kernel(long long nanoseconds, unsigned long long* stamps,
                                             int index) {
  const unsigned long long start = global_timer_ns();
  spin_for_ns(nanoseconds);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    stamps[2 * index] = start;
    stamps[2 * index + 1] = global_timer_ns();
  }
}

// spin_stamp_kernel whose end is its last block's: block 0's first thread writes its start to
// stamps[2 * index], every block's first thread raises stamps[2 * index + 1] to its own end (the
// caller zeroes the stamps first). kernel_latency --stamps-last-block tells a kernel whose last
// blocks started late (waiting for SM slots) from an answer that came late.
extern "C" __global__ void spin_span_kernel(long long nanoseconds, unsigned long long* stamps,
                                            int index) {
  const unsigned long long start = global_timer_ns();
  spin_for_ns(nanoseconds);
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) stamps[2 * index] = start;
    atomicMax(&stamps[2 * index + 1], global_timer_ns());
  }
}

// Sleeps without occupying the issue slots: other work may overlap it on the same SMs.
extern "C" __global__ void sleep_kernel(int microseconds) {
  const unsigned long long start = global_timer_ns();
  const long long duration_ns = 1000LL * microseconds;
  while (static_cast<long long>(global_timer_ns() - start) < duration_ns) __nanosleep(1000);
}

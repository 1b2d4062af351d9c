// Special registers the timing and diagnostic kernels read.
#pragma once

// %globaltimer is a nanosecond wall clock shared by all SMs, unlike clock64() which counts the
// cycles of one SM and changes rate with the clock frequency.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void spin_for_ns(long long nanoseconds) {
  const unsigned long long start = global_timer_ns();
  while (static_cast<long long>(global_timer_ns() - start) < nanoseconds) {
  }
}

__device__ __forceinline__ unsigned int sm_id() {
  unsigned int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

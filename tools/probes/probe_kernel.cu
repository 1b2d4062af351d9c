// The kernel tools/probes/graph_node_args.cpp launches: writes `value` to `*out`.
extern "C" __global__ void store_value(int* out, int value) {
  *out = value;
}
// The kernel tools/probes/sync_paths.cpp launches: does nothing, so a round trip is all latency.
extern "C" __global__ void empty() {}
// The kernel tools/probes/graph_tail_disabled.cpp launches: spins `ns` and stamps when it ran.
extern "C" __global__ void spin_stamp(long long ns, unsigned long long* stamps, int index) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<long long>(now - start) < ns);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    stamps[2 * index] = start;
    stamps[2 * index + 1] = now;
  }
}

// Black-box probe of the real driver: what does a batch of launches cost on the GPU and on the
// CPU when it goes out (a) as eager launches, (b) as the server's power-of-two runs (55 launches:
// a 32-node graph, a 16-node graph and 7 eager launches), (c) as one 64-node graph whose last
// nodes are disabled (cuGraphNodeSetEnabled), (d) as one graph of the exact length? Launch
// batching (broker/server/launch/launch_batch.cpp) pays ~3 us of idle stream at each graph launch's
// start; (c) would make every batch one graph launch. Each kernel spins ~10 us (2 blocks of 32
// threads, as examples/small_kernels) and stamps its start and end with %globaltimer; bursts go
// out back to back on one stream, so the GPU is always fed and what shows is the stream's own
// idle time between kernels.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o /tmp/probe_kernel.cubin tools/probes/probe_kernel.cu
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/graph_tail_disabled.cpp -lcuda
//   -o /tmp/tail && /tmp/tail /tmp/probe_kernel.cubin [burst=55] [bursts=200]
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "must.hpp"

namespace {

constexpr long long kSpinNs = 10000;

struct Kernel {
  CUfunction f;
  CUdeviceptr stamps;
};

struct ArgsStore {
  long long ns = kSpinNs;
  CUdeviceptr stamps = 0;
  int index = 0;
  void* params[3] = {&ns, &stamps, &index};
};

CUDA_KERNEL_NODE_PARAMS node(const Kernel& k, ArgsStore& a) {
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = k.f;
  p.gridDimX = 2;
  p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = 32;
  p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = a.params;
  return p;
}

struct Chain {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  std::vector<CUgraphNode> nodes;
  std::vector<bool> enabled;
};

Chain build(const Kernel& k, int n) {
  Chain c;
  MUST(cuGraphCreate(&c.graph, 0));
  ArgsStore a;
  a.stamps = k.stamps;
  for (int i = 0; i < n; ++i) {
    CUDA_KERNEL_NODE_PARAMS p = node(k, a);
    CUgraphNode nd;
    MUST(cuGraphAddKernelNode(&nd, c.graph, c.nodes.empty() ? nullptr : &c.nodes.back(),
                              c.nodes.empty() ? 0 : 1, &p));
    c.nodes.push_back(nd);
  }
  MUST(cuGraphInstantiateWithFlags(&c.exec, c.graph, 0));
  c.enabled.assign(n, true);
  return c;
}

// Sets nodes [0, count) to kernels first..first+count-1 and disables the rest when `tail`.
void launch_chain(const Kernel& k, Chain& c, int first, int count, CUstream s, bool tail) {
  ArgsStore a;
  a.stamps = k.stamps;
  for (int i = 0; i < count; ++i) {
    a.index = first + i;
    CUDA_KERNEL_NODE_PARAMS p = node(k, a);
    if (tail && !c.enabled[i]) {
      MUST(cuGraphNodeSetEnabled(c.exec, c.nodes[i], 1));
      c.enabled[i] = true;
    }
    MUST(cuGraphExecKernelNodeSetParams(c.exec, c.nodes[i], &p));
  }
  if (tail) {
    for (std::size_t i = count; i < c.nodes.size(); ++i) {
      if (c.enabled[i]) {
        MUST(cuGraphNodeSetEnabled(c.exec, c.nodes[i], 0));
        c.enabled[i] = false;
      }
    }
  }
  MUST(cuGraphLaunch(c.exec, s));
}

void launch_eager(const Kernel& k, int index, CUstream s) {
  ArgsStore a;
  a.stamps = k.stamps;
  a.index = index;
  MUST(cuLaunchKernel(k.f, 2, 1, 1, 32, 1, 1, 0, s, a.params, nullptr));
}

struct Result {
  double gap_us, max_gap_us, span_per_burst_us, cpu_per_burst_us;
};

template <class Issue>
Result measure(const Kernel& k, CUstream s, int burst, int bursts, Issue issue) {
  const int total = burst * bursts;
  MUST(cuMemsetD8(k.stamps, 0, 16ull * total));
  MUST(cuCtxSynchronize());
  double cpu = 0;
  for (int b = 0; b < bursts; ++b) {
    auto t0 = std::chrono::steady_clock::now();
    issue(b * burst);
    cpu += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  MUST(cuCtxSynchronize());
  std::vector<unsigned long long> st(2 * total);
  MUST(cuMemcpyDtoH(st.data(), k.stamps, 16ull * total));
  // Skip the first burst (the stream starts idle); gaps between kernels of later ones.
  double sum = 0, mx = 0;
  int n = 0;
  for (int i = burst + 1; i < total; ++i) {
    const double g = 1e-3 * (static_cast<double>(st[2 * i]) - static_cast<double>(st[2 * i - 1]));
    sum += g;
    mx = std::max(mx, g);
    ++n;
  }
  const double span = 1e-3 * static_cast<double>(st[2 * total - 1] - st[2 * burst]);
  return {sum / n, mx, span / (bursts - 1), cpu / bursts};
}

void print(const char* name, Result r) {
  std::printf("%-44s gap %.3f us (max %.2f)  GPU per burst %.1f us  CPU per burst %.1f us\n", name,
              r.gap_us, r.max_gap_us, r.span_per_burst_us, r.cpu_per_burst_us);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s probe_kernel.cubin [burst] [bursts]\n", argv[0]);
    return 2;
  }
  const int burst = argc > 2 ? std::atoi(argv[2]) : 55;
  const int bursts = argc > 3 ? std::atoi(argv[3]) : 200;
  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
  MUST(cuCtxSetCurrent(ctx));
  CUmodule mod;
  MUST(cuModuleLoad(&mod, argv[1]));
  Kernel k{};
  MUST(cuModuleGetFunction(&k.f, mod, "spin_stamp"));
  MUST(cuMemAlloc(&k.stamps, 16ull * burst * bursts));
  CUstream s;
  MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  int pow2 = 1;
  while (pow2 < burst) pow2 *= 2;
  std::vector<int> runs;  // the server's power-of-two runs, longest first
  for (int left = burst; left > 0;) {
    int r = 1;
    while (r * 2 <= left) r *= 2;
    runs.push_back(r);
    left -= r;
  }
  std::vector<Chain> by_len(pow2 + 1);
  for (int r : runs)
    if (r >= 8 && by_len[r].exec == nullptr) by_len[r] = build(k, r);
  Chain padded = build(k, pow2);
  Chain exact = build(k, burst);

  std::printf("burst %d, %d bursts, kernels spin %lld ns; power-of-two runs:", burst, bursts,
              kSpinNs);
  for (int r : runs) std::printf(" %d", r);
  std::printf("\n");
  for (int round = 0; round < 2; ++round) {
    print("eager cuLaunchKernel", measure(k, s, burst, bursts, [&](int first) {
            for (int i = 0; i < burst; ++i) launch_eager(k, first + i, s);
          }));
    print("power-of-two runs (< 8 eager)", measure(k, s, burst, bursts, [&](int first) {
            int at = first;
            for (int r : runs) {
              if (r >= 8) {
                launch_chain(k, by_len[r], at, r, s, false);
              } else {
                for (int i = 0; i < r; ++i) launch_eager(k, at + i, s);
              }
              at += r;
            }
          }));
    print("one graph, tail disabled", measure(k, s, burst, bursts, [&](int first) {
            launch_chain(k, padded, first, burst, s, true);
          }));
    print("one graph, tail disabled, toggled each burst",
          measure(k, s, burst, bursts, [&](int first) {
            // Every other burst re-enables the whole tail first: the worst case of toggling.
            if ((first / burst) % 2 == 1) {
              for (std::size_t i = burst; i < padded.nodes.size(); ++i) {
                MUST(cuGraphNodeSetEnabled(padded.exec, padded.nodes[i], 1));
                padded.enabled[i] = true;
              }
            }
            launch_chain(k, padded, first, burst, s, true);
          }));
    print("one graph of the exact length", measure(k, s, burst, bursts, [&](int first) {
            launch_chain(k, exact, first, burst, s, false);
          }));
  }
  std::printf("done\n");
  return 0;
}

// Black-box probe of the real driver: does a green context cost anything after it is destroyed?
// mpsshim gives every client session a green context (sized by its SM quota) and destroys it
// at the session's end. The first GPU soak (docs/testing.md, "Soak") saw the server grow by
// ~1.7 MB of RSS and ~4 MiB of device memory per client session for as long as other clients
// kept the primary context alive. This creates and destroys a green context (with one stream
// on it, as a session has) 200 times with the primary context retained, and prints the
// process's RSS and the device memory in use every 50 rounds. Argument 0: a 40-SM partition;
// 1: all SMs.
//
// Measured on an H100, driver 580.159.04 (2026-11-25), both modes alike: start 106 MiB RSS and
// 526 MiB device; after 200 rounds 436 MiB RSS and 1,328 MiB device: +1.65 MiB RSS and +4.0 MiB
// device per round, never returned while the primary context lives. That is the soak's leak.
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/green_context_churn.cpp -lcuda -o
//   /tmp/gl /tmp/gl 0; /tmp/gl 1
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
static long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string l;
  while (std::getline(f, l))
    if (l.rfind("VmRSS:", 0) == 0) return std::atol(l.c_str() + 6);
  return -1;
}
static size_t used() {
  size_t fr, t;
  cuMemGetInfo(&fr, &t);
  return (t - fr) >> 20;
}
#define M(x)                           \
  do {                                 \
    CUresult r = (x);                  \
    if (r) {                           \
      std::printf("%s = %d\n", #x, r); \
      return 1;                        \
    }                                  \
  } while (0)
int main(int argc, char** argv) {
  int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  M(cuInit(0));
  CUdevice d;
  M(cuDeviceGet(&d, 0));
  CUcontext p;
  M(cuDevicePrimaryCtxRetain(&p, d));
  M(cuCtxSetCurrent(p));
  CUdevResource all;
  M(cuDeviceGetDevResource(d, &all, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("mode %d start: rss %ld KiB, device used %zu MiB\n", mode, rss_kib(), used());
  for (int i = 1; i <= 200; ++i) {
    CUdevResource part[1], rest;
    unsigned n = 1;
    M(cuDevSmResourceSplitByCount(part, &n, &all, &rest, 0, 40));
    CUdevResourceDesc desc;
    M(cuDevResourceGenerateDesc(&desc, mode == 1 ? &all : part, 1));
    CUgreenCtx g;
    M(cuGreenCtxCreate(&g, desc, d, CU_GREEN_CTX_DEFAULT_STREAM));
    CUstream s;
    M(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0));
    M(cuStreamSynchronize(s));
    M(cuStreamDestroy(s));
    M(cuGreenCtxDestroy(g));
    if (i % 50 == 0)
      std::printf("after %d: rss %ld KiB, device used %zu MiB\n", i, rss_kib(), used());
  }
  return 0;
}

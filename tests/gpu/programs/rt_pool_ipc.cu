// Memory-pool IPC through the CUDA runtime: the parent makes an exportable pool
// (cudaMemHandleTypePosixFileDescriptor), exports it as an fd and an allocation as
// cudaMemPoolPtrExportData, and execs itself as the child, which imports both, reads the
// parent's data, writes an answer and frees its import (before the parent frees, as the driver
// requires), and tells the parent what it saw. The result fields (values seen, the driver's answers
// to misuse) must be equal natively and under mpsshim (docs/memory-pools.md).
static const char* const kProgram = "rt_pool_ipc";
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "rt_common.cuh"

namespace {

constexpr size_t kBytes = 1 << 20;

__global__ void fill(unsigned* p, unsigned value, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = value + static_cast<unsigned>(i);
}

__global__ void sum(const unsigned* p, size_t n, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += p[i];
  atomicAdd(out, s);
}

unsigned long long device_sum(const unsigned* p) {
  unsigned long long* out = nullptr;
  RT_CHECK(cudaMalloc(&out, sizeof *out));
  RT_CHECK(cudaMemset(out, 0, sizeof *out));
  sum<<<1, 256>>>(p, kBytes / 4, out);
  RT_CHECK_LAUNCH();
  unsigned long long host = 0;
  RT_CHECK(cudaMemcpy(&host, out, sizeof host, cudaMemcpyDeviceToHost));
  RT_CHECK(cudaFree(out));
  return host;
}

int child(int fd, const char* hex, int to_parent) {
  cudaMemPool_t pool{};
  RT_CHECK(cudaMemPoolImportFromShareableHandle(&pool, reinterpret_cast<void*>(std::intptr_t{fd}),
                                                cudaMemHandleTypePosixFileDescriptor, 0));
  cudaMemPoolPtrExportData data{};
  for (size_t i = 0; i < sizeof data.reserved; ++i) {
    data.reserved[i] =
        static_cast<unsigned char>(std::stoul(std::string(hex + 2 * i, 2), nullptr, 16));
  }
  cudaMemPoolPtrExportData zero{};
  void* unused = nullptr;
  const int bad_import = static_cast<int>(cudaMemPoolImportPointer(&unused, pool, &zero));
  (void)cudaGetLastError();
  unsigned* p = nullptr;
  RT_CHECK(cudaMemPoolImportPointer(reinterpret_cast<void**>(&p), pool, &data));
  const unsigned long long seen = device_sum(p);
  const int alloc_from_import = static_cast<int>(cudaMallocFromPoolAsync(&unused, 4096, pool, 0));
  (void)cudaGetLastError();
  fill<<<1, 16>>>(p, 1000, 16);  // the answer: the first 16 words
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaDeviceSynchronize());
  RT_CHECK(cudaFree(p));
  RT_CHECK(cudaMemPoolDestroy(pool));
  dprintf(to_parent, "child_seen=%llu bad_import=%d alloc_from_import=%d", seen, bad_import,
          alloc_from_import);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "child") == 0) {
    return child(std::atoi(argv[2]), argv[3], std::atoi(argv[4]));
  }
  int handle_types = 0;
  RT_CHECK(cudaDeviceGetAttribute(&handle_types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  props.location = {cudaMemLocationTypeDevice, 0};
  cudaMemPool_t pool{};
  RT_CHECK(cudaMemPoolCreate(&pool, &props));
  unsigned* p = nullptr;
  RT_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&p), kBytes, pool, 0));
  fill<<<64, 256>>>(p, 7, kBytes / 4);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaDeviceSynchronize());
  const unsigned long long expected = device_sum(p);
  int fd = -1;
  RT_CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  cudaMemPoolPtrExportData data{}, unused{};
  RT_CHECK(cudaMemPoolExportPointer(&data, p));
  const int inner_export = static_cast<int>(cudaMemPoolExportPointer(&unused, p + 1024));
  (void)cudaGetLastError();
  cudaIpcMemHandle_t legacy{};
  const int legacy_export = static_cast<int>(cudaIpcGetMemHandle(&legacy, p));
  (void)cudaGetLastError();
  char hex[2 * sizeof data.reserved + 1];
  for (size_t i = 0; i < sizeof data.reserved; ++i) {
    std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned char>(data.reserved[i]));
  }
  int from_child[2];
  if (pipe(from_child) != 0) return 2;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string fds = std::to_string(fd), wr = std::to_string(from_child[1]);
    execl(argv[0], argv[0], "child", fds.c_str(), hex, wr.c_str(), nullptr);
    _exit(99);
  }
  close(from_child[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  char said[256] = {};
  const ssize_t got = read(from_child[0], said, sizeof said - 1);
  if (got <= 0) std::strcpy(said, "child_said_nothing");
  unsigned answer[16];
  RT_CHECK(cudaMemcpy(answer, p, sizeof answer, cudaMemcpyDeviceToHost));
  bool answered = true;
  for (unsigned i = 0; i < 16; ++i) answered = answered && answer[i] == 1000 + i;
  RT_CHECK(cudaFreeAsync(p, 0));
  RT_CHECK(cudaDeviceSynchronize());
  RT_CHECK(cudaMemPoolDestroy(pool));
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && answered &&
                  std::strstr(said, ("child_seen=" + std::to_string(expected)).c_str()) != nullptr;
  return RT_REPORT(ok,
                   "posix_fd=%d expected=%llu %s answered=%d inner_export=%d legacy_export=%d "
                   "child_exit=%d",
                   (handle_types & cudaMemHandleTypePosixFileDescriptor) != 0 ? 1 : 0, expected,
                   said, answered ? 1 : 0, inner_export, legacy_export,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

// CUDA IPC between two processes on one GPU (docs/ipc.md): the parent exports an allocation
// (through a pointer inside it) and an interprocess event; the child opens both, checks the
// parent's data with a kernel that also writes the parent's memory, then records the event
// behind a slow kernel and a flag; the parent waits on the event on its own stream and must see
// the flag and the child's writes. Result fields say what the driver answered where its
// documentation leaves it open: opening one's own handle (`own_open`), whether an open answers
// the allocation's base or the exported inner pointer (`opened_at`). The suite compares them
// between the native run and the shim's. Exit 77 without a GPU.
static const char* const kProgram = "rt_ipc";
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "rt_common.cuh"

constexpr int kHalf = 1 << 16;
constexpr std::size_t kFlagIndex = 2 * kHalf;
constexpr std::size_t kBytes = (2 * kHalf + 64) * sizeof(unsigned);
constexpr std::size_t kInnerOffset = 4096;  // the exported pointer, inside the allocation
constexpr unsigned kSecondStart = 1000;
constexpr unsigned kFlag = 7;
constexpr unsigned long long kSlowNs = 200ull * 1000 * 1000;

struct Handles {
  int skip;
  cudaIpcMemHandle_t memory;
  cudaIpcEventHandle_t event;
};
struct ChildResult {
  int opened_at_base;  // 1: the open answered the allocation's base, 0: the inner pointer
  int wrong_first;     // elements of the parent's first half the child's kernel found wrong
  int close_error;     // cudaIpcCloseMemHandle's result
  int failed_line;     // 0, or the line of a call that failed in the child
};

__global__ void add_twice_first(unsigned* base, int* wrong) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kHalf; i += gridDim.x * blockDim.x) {
    if (base[i] != static_cast<unsigned>(i)) atomicAdd(wrong, 1);
    base[kHalf + i] += 2 * base[i];
  }
}

__global__ void slow_flag(unsigned* flag) {
  rt_spin_ns(kSlowNs);
  *flag = kFlag;
}

bool read_all(int fd, void* data, std::size_t bytes) {
  auto* p = static_cast<char*>(data);
  while (bytes != 0) {
    ssize_t n = read(fd, p, bytes);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}
void write_all(int fd, const void* data, std::size_t bytes) {
  if (write(fd, data, bytes) != static_cast<ssize_t>(bytes)) std::exit(3);
}

// The child: any failed call ends it with the failing line in its result.
#define CHILD_CHECK(call)                           \
  do {                                              \
    if ((call) != cudaSuccess) {                    \
      result.failed_line = __LINE__;                \
      write_all(to_parent, &result, sizeof result); \
      return 1;                                     \
    }                                               \
  } while (0)

int child(int from_parent, int to_parent) {
  Handles handles{};
  if (!read_all(from_parent, &handles, sizeof handles) || handles.skip) return 77;
  ChildResult result{};
  CHILD_CHECK(cudaSetDevice(0));
  void* opened = nullptr;
  CHILD_CHECK(cudaIpcOpenMemHandle(&opened, handles.memory, cudaIpcMemLazyEnablePeerAccess));
  unsigned first = 0;
  CHILD_CHECK(cudaMemcpy(&first, opened, sizeof first, cudaMemcpyDeviceToHost));
  result.opened_at_base = first == 0;
  auto* base = static_cast<unsigned*>(opened);
  if (!result.opened_at_base)
    base = reinterpret_cast<unsigned*>(static_cast<char*>(opened) - kInnerOffset);
  int* wrong = nullptr;
  CHILD_CHECK(cudaMalloc(&wrong, sizeof(int)));
  CHILD_CHECK(cudaMemset(wrong, 0, sizeof(int)));
  cudaStream_t stream;
  CHILD_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  add_twice_first<<<64, 256, 0, stream>>>(base, wrong);
  CHILD_CHECK(cudaGetLastError());
  CHILD_CHECK(
      cudaMemcpyAsync(&result.wrong_first, wrong, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CHILD_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t event;
  CHILD_CHECK(cudaIpcOpenEventHandle(&event, handles.event));
  slow_flag<<<1, 1, 0, stream>>>(base + kFlagIndex);
  CHILD_CHECK(cudaGetLastError());
  CHILD_CHECK(cudaEventRecord(event, stream));
  const char recorded = 'r';
  write_all(to_parent, &recorded, 1);
  char done = 0;
  if (!read_all(from_parent, &done, 1)) return 1;
  CHILD_CHECK(cudaStreamSynchronize(stream));
  CHILD_CHECK(cudaEventDestroy(event));
  result.close_error = cudaIpcCloseMemHandle(opened);
  CHILD_CHECK(cudaFree(wrong));
  write_all(to_parent, &result, sizeof result);
  return 0;
}

int main() {
  // Fork before any CUDA call: a child may not use a context its parent made.
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return 2;
  const pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    return child(down[0], up[1]);
  }
  close(down[0]);
  close(up[1]);
  Handles handles{};
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    handles.skip = 1;
    write_all(down[1], &handles, sizeof handles);
    waitpid(pid, nullptr, 0);
    std::printf("%s: no GPU SKIP\n", kProgram);
    return 77;
  }
  RT_CHECK(cudaSetDevice(0));
  unsigned* buffer = nullptr;
  RT_CHECK(cudaMalloc(&buffer, kBytes));
  std::vector<unsigned> host(kBytes / sizeof(unsigned), 0);
  for (int i = 0; i < kHalf; ++i) {
    host[i] = static_cast<unsigned>(i);
    host[kHalf + i] = kSecondStart;
  }
  RT_CHECK(cudaMemcpy(buffer, host.data(), kBytes, cudaMemcpyHostToDevice));
  RT_CHECK(cudaIpcGetMemHandle(&handles.memory, reinterpret_cast<char*>(buffer) + kInnerOffset));
  void* own = nullptr;
  const cudaError_t own_open =
      cudaIpcOpenMemHandle(&own, handles.memory, cudaIpcMemLazyEnablePeerAccess);
  cudaGetLastError();  // the refusal is the result, not a sticky error
  cudaEvent_t event;
  RT_CHECK(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming));
  RT_CHECK(cudaIpcGetEventHandle(&handles.event, event));
  write_all(down[1], &handles, sizeof handles);

  char recorded = 0;
  ChildResult result{};
  if (!read_all(up[0], &recorded, 1) || recorded != 'r') {
    read_all(up[0], &result, sizeof result);
    waitpid(pid, nullptr, 0);
    return RT_REPORT(false, "child_failed_line=%d", result.failed_line);
  }
  // The child's record stands behind its 200 ms kernel and the flag: waiting on the event
  // orders this stream's read after them.
  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned flag = 0;
  RT_CHECK(cudaStreamWaitEvent(stream, event, 0));
  RT_CHECK(
      cudaMemcpyAsync(&flag, buffer + kFlagIndex, sizeof flag, cudaMemcpyDeviceToHost, stream));
  RT_CHECK(cudaStreamSynchronize(stream));
  RT_CHECK(cudaEventSynchronize(event));
  const cudaError_t queried = cudaEventQuery(event);
  RT_CHECK(cudaMemcpy(host.data(), buffer, kBytes, cudaMemcpyDeviceToHost));
  int wrong_second = 0;
  for (int i = 0; i < kHalf; ++i) {
    wrong_second += host[kHalf + i] != kSecondStart + 2 * static_cast<unsigned>(i);
  }
  const char done = 'd';
  write_all(down[1], &done, 1);
  const bool got_result = read_all(up[0], &result, sizeof result);
  int status = 0;
  waitpid(pid, &status, 0);
  const int child_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  RT_CHECK(cudaEventDestroy(event));
  RT_CHECK(cudaFree(buffer));
  const bool ok = got_result && result.failed_line == 0 && child_exit == 0 && flag == kFlag &&
                  queried == cudaSuccess && result.wrong_first == 0 && wrong_second == 0 &&
                  result.close_error == cudaSuccess;
  return RT_REPORT(ok,
                   "own_open=%s opened_at=%s flag=%u wrong_first=%d wrong_second=%d query=%s "
                   "close=%s child_exit=%d child_failed_line=%d",
                   cudaGetErrorName(own_open), result.opened_at_base ? "base" : "inner", flag,
                   result.wrong_first, wrong_second, cudaGetErrorName(queried),
                   cudaGetErrorName(static_cast<cudaError_t>(result.close_error)), child_exit,
                   result.failed_line);
}

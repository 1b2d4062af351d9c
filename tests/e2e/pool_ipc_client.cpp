// Memory-pool IPC between two processes through the whole path (docs/memory-pools.md): run under
// LD_PRELOAD=libmpsshim.so against mpsshimd and the test driver by tests/e2e/ipc_test.cpp. The
// exporter makes two exportable pools, exports them as fds and an allocation of the first as
// CUmemPoolPtrExportData, and execs itself as the importer, which imports them, reads and writes
// the allocation, and still reads it after the exporter freed its side. The errors expected are
// the H200's (driver 580) for the same calls natively. Each side prints PASS or FAIL lines.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr std::size_t kBytes = 1 << 20;
constexpr unsigned kPattern = 0x1234;
constexpr unsigned kAnswer = 0xabcd;

CUcontext start() {
  CUdevice device{};
  CUcontext ctx{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

CUmemoryPool exportable_pool() {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemoryPool pool{};
  CHECK(cuMemPoolCreate(&pool, &props));
  return pool;
}

std::string hex(const void* data, std::size_t bytes) {
  std::string out;
  char two[3];
  for (std::size_t i = 0; i < bytes; ++i) {
    std::snprintf(two, sizeof two, "%02x", static_cast<const unsigned char*>(data)[i]);
    out += two;
  }
  return out;
}

unsigned word_at(CUdeviceptr p) {
  unsigned v = 0;
  CHECK(cuMemcpyDtoH(&v, p, sizeof v));
  return v;
}

int exporter(const char* self) {
  start();
  int handle_types = 0;
  CHECK(cuDeviceGetAttribute(&handle_types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0));
  if ((handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return fail("MEMPOOL_SUPPORTED_HANDLE_TYPES has no POSIX fd");
  }
  CUmemoryPool pool = exportable_pool();
  CUmemoryPool other = exportable_pool();
  CUdeviceptr p = 0, q = 0, plain = 0;
  CHECK(cuMemAllocFromPoolAsync(&p, kBytes, pool, nullptr));
  CHECK(cuMemAllocFromPoolAsync(&q, 4096, other, nullptr));
  CHECK(cuMemsetD32Async(p, kPattern, kBytes / 4, nullptr));
  CHECK(cuCtxSynchronize());
  int fd = -1, other_fd = -1;
  CHECK(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CHECK(cuMemPoolExportToShareableHandle(&other_fd, other, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                         0));
  CUmemPoolPtrExportData data{}, other_data{}, unused{};
  CHECK(cuMemPoolExportPointer(&data, p));
  CHECK(cuMemPoolExportPointer(&other_data, q));
  // What the driver refuses: a pointer inside the allocation, memory of no pool, pools that are
  // not exportable (the default pool) or not as that type, and pool memory by legacy IPC.
  EXPECT(cuMemPoolExportPointer(&unused, p + 4096), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(&plain, 4096));
  EXPECT(cuMemPoolExportPointer(&unused, plain), CUDA_ERROR_INVALID_VALUE);
  CUmemoryPool default_pool{};
  CHECK(cuDeviceGetDefaultMemPool(&default_pool, 0));
  int unused_fd = -1;
  EXPECT(cuMemPoolExportToShareableHandle(&unused_fd, default_pool,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemPoolExportToShareableHandle(&unused_fd, pool, CU_MEM_HANDLE_TYPE_FABRIC, 0),
         CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle legacy{};
  EXPECT(cuIpcGetMemHandle(&legacy, p), CUDA_ERROR_INVALID_VALUE);

  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return fail("pipe");
  const std::vector<std::string> args = {self,
                                         "import",
                                         std::to_string(fd),
                                         std::to_string(other_fd),
                                         hex(&data, sizeof data),
                                         hex(&other_data, sizeof other_data),
                                         std::to_string(to_child[0]),
                                         std::to_string(from_child[1])};
  const pid_t child = ::fork();
  if (child == 0) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(self, argv.data());
    std::_Exit(99);
  }
  char step = 0;
  if (::read(from_child[0], &step, 1) != 1) return fail("the importer ended before importing");
  if (word_at(p) != kAnswer) return fail("the importer's write is not in the exporter's memory");
  // Freed here while the importer holds it: it stays for the importer.
  CHECK(cuMemFreeAsync(p, nullptr));
  CHECK(cuCtxSynchronize());
  if (::write(to_child[1], "f", 1) != 1) return fail("pipe write");
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return fail("the importer failed");
  CHECK(cuMemFreeAsync(q, nullptr));
  CHECK(cuMemFree(plain));
  CHECK(cuMemPoolDestroy(pool));
  CHECK(cuMemPoolDestroy(other));
  ::close(fd);
  ::close(other_fd);
  std::printf("PASS pool_ipc exporter\n");
  return 0;
}

bool unhex(const std::string& text, CUmemPoolPtrExportData& out) {
  if (text.size() != 2 * sizeof out.reserved) return false;
  for (std::size_t i = 0; i < sizeof out.reserved; ++i) {
    out.reserved[i] = static_cast<unsigned char>(std::stoul(text.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

int importer(char** argv) {
  start();
  const int fd = std::atoi(argv[2]);
  const int other_fd = std::atoi(argv[3]);
  CUmemPoolPtrExportData data{}, other_data{};
  if (!unhex(argv[4], data) || !unhex(argv[5], other_data)) return fail("export data");
  const int from_parent = std::atoi(argv[6]);
  const int to_parent = std::atoi(argv[7]);
  CUmemoryPool pool{}, other{};
  CHECK(cuMemPoolImportFromShareableHandle(&pool, reinterpret_cast<void*>(std::intptr_t{fd}),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CHECK(cuMemPoolImportFromShareableHandle(&other, reinterpret_cast<void*>(std::intptr_t{other_fd}),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUdeviceptr p = 0, unused = 0;
  // Another pool's export data, and none at all, are refused.
  EXPECT(cuMemPoolImportPointer(&unused, pool, &other_data), CUDA_ERROR_INVALID_VALUE);
  CUmemPoolPtrExportData zero{};
  EXPECT(cuMemPoolImportPointer(&unused, pool, &zero), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolImportPointer(&p, pool, &data));
  if (word_at(p) != kPattern || word_at(p + kBytes - 4) != kPattern) {
    return fail("the imported allocation does not hold the exporter's data");
  }
  CUdeviceptr base = 0;
  size_t bytes = 0;
  CHECK(cuMemGetAddressRange(&base, &bytes, p + 100));
  if (base != p || bytes < kBytes) return fail("cuMemGetAddressRange of an imported pointer");
  // An imported pool gives no allocations; an import is not a legacy IPC open.
  EXPECT(cuMemAllocFromPoolAsync(&unused, 4096, pool, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD32(p, kAnswer, 1));
  CHECK(cuCtxSynchronize());
  if (::write(to_parent, "i", 1) != 1) return fail("pipe write");
  char step = 0;
  if (::read(from_parent, &step, 1) != 1) return fail("the exporter ended early");
  // The exporter freed its side: the memory stays until this import is freed.
  if (word_at(p + 4096) != kPattern)
    return fail("the import lost its memory to the exporter's free");
  CHECK(cuMemFree(p));
  EXPECT(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolDestroy(pool));
  CHECK(cuMemPoolDestroy(other));
  std::printf("PASS pool_ipc importer\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "export") return exporter(argv[0]);
  if (mode == "import" && argc == 8) return importer(argv);
  std::printf("FAIL unknown mode %s\n", mode.c_str());
  return 2;
}

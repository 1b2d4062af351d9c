// The CUDA IPC client of the CPU end-to-end tests (ipc_test.cpp, docs/ipc.md), run under
// LD_PRELOAD=libmpsshim.so: one process exports an allocation and an interprocess event,
// another opens both. Handles travel as hex on stdout and the command line; a closed stdin
// tells a waiting process to go on. Each mode prints PASS or FAIL lines and exits 0 only when
// what it checked held.
#include <cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e test module\n.version 8.0\n.target sm_90\n";

// The shared allocation: kHalf floats the exporter writes (i), kHalf floats it sets to
// kSecondStart and the importer's kernel adds 2 * the first half to, then one flag word the
// importer sets to kFlag behind a slow kernel.
constexpr int kHalf = 2048;
constexpr std::size_t kBytes = (2 * kHalf + 64) * sizeof(float);
constexpr float kSecondStart = 1000.0f;
constexpr unsigned kFlag = 7;
constexpr std::size_t kFlagOffset = 2 * kHalf * sizeof(float);
// The exporter exports a pointer inside its allocation, not its base: the handle still names
// the whole allocation and an open answers its base, as with the driver.
constexpr std::size_t kExportedOffset = 4096;
constexpr int kSlowKernelUs = 300000;

struct Setup {
  CUcontext ctx{};
  CUmodule module{};
  CUstream stream{};
};

Setup setup(int ordinal = 0) {
  Setup s;
  CUdevice device{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, ordinal));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuModuleLoadData(&s.module, kModuleImage));
  CHECK(cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING));
  return s;
}

template <typename Handle>
std::string hex_of(const Handle& handle) {
  std::string out;
  char digits[3];
  for (char c : handle.reserved) {
    std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(c));
    out += digits;
  }
  return out;
}

template <typename Handle>
Handle handle_of(const std::string& hex) {
  Handle handle{};
  for (std::size_t i = 0; i < sizeof(handle.reserved) && 2 * i + 1 < hex.size(); ++i) {
    handle.reserved[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return handle;
}

void wait_for_stdin_eof() {
  char buffer[64];
  while (::read(0, buffer, sizeof buffer) > 0) {
  }
}

// One line at a time, at once: the test waits for some of them while the client runs on.
#define SAY(...)              \
  do {                        \
    std::printf(__VA_ARGS__); \
    std::fflush(stdout);      \
  } while (0)

std::vector<float> download(CUdeviceptr from, std::size_t count) {
  std::vector<float> out(count);
  CHECK(cuMemcpyDtoH(out.data(), from, count * sizeof(float)));
  return out;
}

bool first_half_intact(CUdeviceptr base) {
  std::vector<float> first = download(base, kHalf);
  for (int i = 0; i < kHalf; ++i) {
    if (first[i] != static_cast<float>(i)) {
      SAY("FAIL first half [%d] = %f, want %d\n", i, first[i], i);
      return false;
    }
  }
  return true;
}

bool second_half_added(CUdeviceptr base) {
  std::vector<float> second = download(base + kHalf * sizeof(float), kHalf);
  for (int i = 0; i < kHalf; ++i) {
    if (second[i] != kSecondStart + 2.0f * static_cast<float>(i)) {
      SAY("FAIL second half [%d] = %f, want %f\n", i, second[i], kSecondStart + 2.0f * i);
      return false;
    }
  }
  return true;
}

// export [keep|free|watch]: allocates and fills the buffer, exports it and an interprocess event,
// prints them and waits for stdin to close. Then it waits on the event on a stream of its own
// (the importer recorded it behind a slow kernel and the flag), and checks the flag and the
// importer's kernel's results. `free`: it then frees the allocation and exits while the
// importer still holds it open. `watch`: it frees it and waits, under a memory limit, until the
// importer's close gives the bytes back to it.
int export_side(const std::string& then) {
  Setup s = setup();
  CUdeviceptr base = 0;
  CHECK(cuMemAlloc(&base, kBytes));
  std::vector<float> host(2 * kHalf + 64, 0.0f);
  for (int i = 0; i < kHalf; ++i) {
    host[i] = static_cast<float>(i);
    host[kHalf + i] = kSecondStart;
  }
  CHECK(cuMemcpyHtoD(base, host.data(), kBytes));
  CUipcMemHandle memory{};
  CHECK(cuIpcGetMemHandle(&memory, base + kExportedOffset));
  CUipcMemHandle again{};
  CHECK(cuIpcGetMemHandle(&again, base));
  CUevent timed{};
  CHECK(cuEventCreate(&timed, CU_EVENT_DEFAULT));
  CUipcEventHandle refused{};
  const CUresult not_interprocess = cuIpcGetEventHandle(&refused, timed);
  CUevent event{};
  CHECK(cuEventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  CUipcEventHandle event_handle{};
  CHECK(cuIpcGetEventHandle(&event_handle, event));
  // Its own handle: a process cannot open what it exported.
  CUdeviceptr own = 0;
  const CUresult own_open = cuIpcOpenMemHandle(&own, memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  const bool same_handle = std::memcmp(memory.reserved, again.reserved, 32) == 0;
  SAY("EXPORTED base=%llu mem=%s event=%s own_open=%d not_interprocess=%d same_handle=%d\n",
      static_cast<unsigned long long>(base), hex_of(memory).c_str(), hex_of(event_handle).c_str(),
      own_open, not_interprocess, same_handle);
  bool ok = own_open == CUDA_ERROR_INVALID_CONTEXT &&
            not_interprocess == CUDA_ERROR_INVALID_VALUE && same_handle;
  wait_for_stdin_eof();

  // The importer recorded the event behind its slow kernel and the flag: a wait on it orders
  // this stream's read of the flag after them.
  unsigned flag = 0;
  CHECK(cuStreamWaitEvent(s.stream, event, 0));
  CHECK(cuMemcpyDtoHAsync(&flag, base + kFlagOffset, sizeof flag, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  CHECK(cuEventSynchronize(event));
  const CUresult queried = cuEventQuery(event);
  ok &= flag == kFlag && queried == CUDA_SUCCESS && second_half_added(base) &&
        first_half_intact(base);
  SAY("%s export flag=%u query=%d\n", ok ? "PASS" : "FAIL", flag, queried);
  if (then == "free") {
    CHECK(cuMemFree(base));  // the importer still holds it: it stays for the importer
    CHECK(cuEventDestroy(event));
    SAY("FREED\n");
    return ok ? 0 : 1;
  }
  if (then == "watch") {
    // Under a memory limit: freed while the importer holds it, the allocation stays charged to
    // this client until the importer closes it; then the bytes come back.
    size_t limit = 0, free_after = 0, total = 0;
    CHECK(cuMemGetInfo(&limit, &total));  // nothing else held: free is the whole limit
    limit += kBytes;
    CHECK(cuMemFree(base));
    CHECK(cuMemGetInfo(&free_after, &total));
    SAY("FREED still_charged=%d\n", free_after == limit - kBytes);
    ok &= free_after == limit - kBytes;
    size_t free_now = free_after;
    for (int i = 0; i < 1500 && free_now != limit; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      CHECK(cuMemGetInfo(&free_now, &total));
    }
    ok &= free_now == limit;
    SAY("%s watch returned=%d\n", ok ? "PASS" : "FAIL", free_now == limit);
    CHECK(cuEventDestroy(event));
    return ok ? 0 : 1;
  }
  CHECK(cuEventDestroy(event));
  CHECK(cuMemFree(base));
  return ok ? 0 : 1;
}

// import <mem> <event> [close|leave]: opens both handles, checks the exporter's data with a
// copy, adds twice the first half to the second half with a kernel (it writes the exporter's
// memory), then queues a slow kernel, the flag and a record of the event, and waits for stdin
// to close. Then it reads the memory again (the exporter may have freed it and exited
// meanwhile) and closes it (`close`), or exits holding it (`leave`).
int import_side(const std::string& memory_hex, const std::string& event_hex,
                const std::string& then) {
  Setup s = setup();
  const auto memory = handle_of<CUipcMemHandle>(memory_hex);
  CUdeviceptr base = 0;
  CHECK(cuIpcOpenMemHandle(&base, memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  // A second open of an open handle answers the same pointer and counts one more open.
  CUdeviceptr twice = 0;
  CHECK(cuIpcOpenMemHandle_v2(&twice, memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CUdeviceptr range_base = 0;
  size_t range_bytes = 0;
  CHECK(cuMemGetAddressRange(&range_base, &range_bytes, base + 100));
  // Opened memory is closed, never freed.
  const CUresult freed = cuMemFree(base);
  bool ok = twice == base && range_base == base && range_bytes == kBytes &&
            freed == CUDA_ERROR_INVALID_VALUE && first_half_intact(base);

  CUfunction scale_add{}, sleeper{};
  CHECK(cuModuleGetFunction(&scale_add, s.module, "scale_add"));
  CHECK(cuModuleGetFunction(&sleeper, s.module, "sleep_kernel"));
  CUdeviceptr y = base + kHalf * sizeof(float);
  CUdeviceptr x = base;
  float alpha = 2.0f;
  int n = kHalf;
  void* add_args[] = {&y, &x, &alpha, &n};
  CHECK(cuLaunchKernel(scale_add, 8, 1, 1, 256, 1, 1, 0, s.stream, add_args, nullptr));
  CHECK(cuStreamSynchronize(s.stream));
  ok &= second_half_added(base);

  CUevent event{};
  CHECK(cuIpcOpenEventHandle(&event, handle_of<CUipcEventHandle>(event_hex)));
  int us = kSlowKernelUs;
  void* sleep_args[] = {&us};
  CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, s.stream, sleep_args, nullptr));
  CHECK(cuMemsetD32Async(base + kFlagOffset, kFlag, 1, s.stream));
  CHECK(cuEventRecord(event, s.stream));
  SAY("RECORDED base=%llu\n", static_cast<unsigned long long>(base));
  wait_for_stdin_eof();

  CHECK(cuEventSynchronize(event));
  ok &= first_half_intact(base) && second_half_added(base);
  CHECK(cuEventDestroy(event));
  if (then == "close") {
    CHECK(cuIpcCloseMemHandle(base));
    CHECK(cuIpcCloseMemHandle(base));
    ok &= cuIpcCloseMemHandle(base) == CUDA_ERROR_INVALID_VALUE;  // both opens closed
  }
  SAY("%s import\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// import_on <device> <mem> <event>: the importer on another GPU than the exporter's (ipc.md,
// "Across GPUs"): opens the exporter's event (as an event of the exporter's GPU), opens the
// memory handle twice, reads the exporter's data (from an inner pointer too), adds
// twice the first half to the second half with a kernel on its own GPU, sets the flag, prints
// RECORDED and waits for stdin to close; then closes both opens, after which the memory is
// gone from this process.
int import_on(int device, const std::string& memory_hex, const std::string& event_hex) {
  Setup s = setup(device);
  // The exporter's event opens as an event of its GPU: queried, waited on by this GPU's stream.
  CUevent event{};
  CHECK(cuIpcOpenEventHandle(&event, handle_of<CUipcEventHandle>(event_hex)));
  const CUresult queried = cuEventQuery(event);
  CHECK(cuStreamWaitEvent(s.stream, event, 0));
  CHECK(cuEventSynchronize(event));
  const CUresult recorded_here = cuEventRecord(event, s.stream);  // another GPU's event
  CHECK(cuEventDestroy(event));
  const auto memory = handle_of<CUipcMemHandle>(memory_hex);
  CUdeviceptr base = 0, twice = 0;
  CHECK(cuIpcOpenMemHandle(&base, memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CHECK(cuIpcOpenMemHandle(&twice, memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CUdeviceptr range_base = 0;
  size_t range_bytes = 0;
  CHECK(cuMemGetAddressRange(&range_base, &range_bytes, base + 100));
  float inner = -1.0f;
  CHECK(cuMemcpyDtoH(&inner, base + 7 * sizeof(float), sizeof inner));
  bool ok = twice == base && range_base == base && range_bytes == kBytes && inner == 7.0f &&
            queried == CUDA_SUCCESS && recorded_here == CUDA_ERROR_INVALID_HANDLE &&
            first_half_intact(base);

  CUfunction scale_add{};
  CHECK(cuModuleGetFunction(&scale_add, s.module, "scale_add"));
  CUdeviceptr y = base + kHalf * sizeof(float);
  CUdeviceptr x = base;
  float alpha = 2.0f;
  int n = kHalf;
  void* add_args[] = {&y, &x, &alpha, &n};
  CHECK(cuLaunchKernel(scale_add, 8, 1, 1, 256, 1, 1, 0, s.stream, add_args, nullptr));
  CHECK(cuMemsetD32Async(base + kFlagOffset, kFlag, 1, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  ok &= second_half_added(base);
  SAY("RECORDED base=%llu\n", static_cast<unsigned long long>(base));
  wait_for_stdin_eof();

  CHECK(cuIpcCloseMemHandle(base));
  ok &= first_half_intact(base);  // one open is left
  CHECK(cuIpcCloseMemHandle(base));
  const CUresult closed_again = cuIpcCloseMemHandle(base);
  const CUresult read_after = cuMemcpyDtoH(&inner, base, sizeof inner);
  ok &= closed_again == CUDA_ERROR_INVALID_VALUE && read_after != CUDA_SUCCESS;
  SAY("%s import_on closed_again=%d read_after=%d\n", ok ? "PASS" : "FAIL", closed_again,
      read_after);
  return ok ? 0 : 1;
}

// forge <mem> <event>: handles changed every way a client could try, each refused with its own
// error, and the session still works afterwards.
int forge(const std::string& memory_hex, const std::string& event_hex) {
  setup();
  const auto genuine = handle_of<CUipcMemHandle>(memory_hex);
  auto open = [](const CUipcMemHandle& handle) {
    CUdeviceptr p = 0;
    return cuIpcOpenMemHandle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  };
  CUipcMemHandle secret_flipped = genuine;
  secret_flipped.reserved[40] ^= 1;  // IpcHandle::secret
  CUipcMemHandle other_token = genuine;
  other_token.reserved[24] ^= 1;  // IpcHandle::token
  CUipcMemHandle other_gpu = genuine;
  other_gpu.reserved[8] ^= 1;  // IpcHandle::device
  CUipcMemHandle other_server = genuine;
  other_server.reserved[16] ^= 1;  // IpcHandle::server_id
  CUipcMemHandle garbage{};
  for (std::size_t i = 0; i < sizeof garbage.reserved; ++i) garbage.reserved[i] = char(i * 37 + 11);
  CUipcEventHandle event_as_memory = handle_of<CUipcEventHandle>(event_hex);
  CUipcMemHandle wrong_kind{};
  std::memcpy(wrong_kind.reserved, event_as_memory.reserved, sizeof wrong_kind.reserved);
  CUevent event{};
  CUipcEventHandle memory_as_event{};
  std::memcpy(memory_as_event.reserved, genuine.reserved, sizeof genuine.reserved);

  const CUresult r_secret = open(secret_flipped);
  const CUresult r_token = open(other_token);
  const CUresult r_gpu = open(other_gpu);
  const CUresult r_server = open(other_server);
  const CUresult r_garbage = open(garbage);
  const CUresult r_kind = open(wrong_kind);
  const CUresult r_event_kind = cuIpcOpenEventHandle(&event, memory_as_event);
  CUdeviceptr p = 0;
  const CUresult r_flags = cuIpcOpenMemHandle(&p, genuine, 0x40);
  const CUresult r_close = cuIpcCloseMemHandle(0x1000);
  SAY("RESULT secret=%d token=%d gpu=%d server=%d garbage=%d kind=%d event_kind=%d flags=%d "
      "close=%d\n",
      r_secret, r_token, r_gpu, r_server, r_garbage, r_kind, r_event_kind, r_flags, r_close);
  bool ok = r_secret == CUDA_ERROR_INVALID_HANDLE && r_token == CUDA_ERROR_INVALID_HANDLE &&
            r_gpu == CUDA_ERROR_NOT_SUPPORTED && r_server == CUDA_ERROR_INVALID_HANDLE &&
            r_garbage == CUDA_ERROR_INVALID_VALUE && r_kind == CUDA_ERROR_INVALID_VALUE &&
            r_event_kind == CUDA_ERROR_INVALID_VALUE && r_flags == CUDA_ERROR_INVALID_VALUE &&
            r_close == CUDA_ERROR_INVALID_VALUE;
  // The session is still whole: the genuine handle opens, and its own memory works.
  CUdeviceptr opened = 0;
  CHECK(cuIpcOpenMemHandle(&opened, genuine, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  ok &= first_half_intact(opened);
  CHECK(cuIpcCloseMemHandle(opened));
  CUdeviceptr mine = 0;
  CHECK(cuMemAlloc(&mine, 4096));
  std::vector<unsigned char> in(4096, 0x5a), out(4096, 0);
  CHECK(cuMemcpyHtoD(mine, in.data(), in.size()));
  CHECK(cuMemcpyDtoH(out.data(), mine, out.size()));
  CHECK(cuMemFree(mine));
  ok &= in == out;
  SAY("%s forge\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// open <mem>: one open, printing the result (the multiuser test: another user's handle).
int open_only(const std::string& memory_hex) {
  setup();
  CUdeviceptr p = 0;
  const CUresult r = cuIpcOpenMemHandle(&p, handle_of<CUipcMemHandle>(memory_hex),
                                        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  SAY("OPEN result=%d\n", r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "export" && argc == 3) return export_side(argv[2]);
  if (mode == "import" && argc == 5) return import_side(argv[2], argv[3], argv[4]);
  if (mode == "forge" && argc == 4) return forge(argv[2], argv[3]);
  if (mode == "open" && argc == 3) return open_only(argv[2]);
  if (mode == "import_on" && argc == 5) return import_on(std::stoi(argv[2]), argv[3], argv[4]);
  std::fprintf(
      stderr,
      "usage: ipc_client export keep|free|watch | import MEM EVENT close|leave | forge MEM "
      "EVENT | open MEM | import_on DEVICE MEM EVENT\n");
  return 2;
}

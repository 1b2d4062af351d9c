// A virtual-memory-management client for the CPU end-to-end tests (vmm_test.cpp): run under
// LD_PRELOAD=libmpsshim.so against mpsshimd and the host-memory test driver. Each mode prints
// one result line ("PASS ..." or "FAIL ...") and exits 0 only when everything it checked held;
// the modes that hold memory for the test print READY and wait.
#include <cuda.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client_check.hpp"
#include "client_expect.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e vmm module\n.version 8.0\n.target sm_90\n";

struct Setup {
  CUcontext ctx{};
  CUmodule module{};
  CUfunction add{};
  CUdevice device{};
};

Setup setup() {
  Setup s;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&s.device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, s.device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuModuleLoadData(&s.module, kModuleImage));
  CHECK(cuModuleGetFunction(&s.add, s.module, "vector_add"));
  return s;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  // As PyTorch's expandable segments and NCCL ask: exportable as a POSIX fd.
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

std::size_t granularity(const CUmemAllocationProp& prop) {
  std::size_t g = 0;
  CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  return g;
}

void set_read_write(CUdeviceptr p, std::size_t bytes, int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(p, bytes, &access, 1));
}

std::size_t free_memory() {
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

// c = a + b over n floats with the test kernel, all three pointers given by the caller.
void vector_add(const Setup& s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, int n) {
  void* args[] = {&a, &b, &c, &n};
  CHECK(cuLaunchKernel(s.add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
}

// Reserve, create, map, set access, write, read back, unmap, release, free; and the driver's
// refusals of bad arguments.
int lifecycle() {
  setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop);
  expect_true(g != 0 && (g & (g - 1)) == 0, "granularity is a power of two");
  const std::size_t free_before = free_memory();

  CUmemGenericAllocationHandle handle{};
  expect(cuMemCreate(&handle, g + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE, "unaligned create");
  CHECK(cuMemCreate(&handle, 2 * g, &prop, 0));
  expect_true(free_memory() + 2 * g <= free_before, "cuMemGetInfo counts the physical memory");

  CUmemAllocationProp back{};
  CHECK(cuMemGetAllocationPropertiesFromHandle(&back, handle));
  expect_true(back.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
                  back.location.type == CU_MEM_LOCATION_TYPE_DEVICE && back.location.id == 0 &&
                  back.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
              "properties from the handle");

  CUdeviceptr va{};
  CHECK(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
  expect_true(va % g == 0, "reservation aligned to the granularity");
  expect(cuMemMap(va + 4096, 2 * g, 0, handle, 0), CUDA_ERROR_INVALID_VALUE, "unaligned map");
  expect(cuMemMap(va + 3 * g, 2 * g, 0, handle, 0), CUDA_ERROR_INVALID_VALUE,
         "map past the reservation's end");
  CHECK(cuMemMap(va, 2 * g, 0, handle, 0));
  expect(cuMemMap(va + g, g, 0, handle, 0), CUDA_ERROR_INVALID_VALUE, "map over a mapping");

  // Mapped but not yet accessible: the server refuses to copy there.
  std::vector<unsigned> host(2 * g / sizeof(unsigned));
  CUresult early = cuMemcpyHtoD(va, host.data(), 4096);
  CUresult early_sync = cuCtxSynchronize();
  expect_true(early != CUDA_SUCCESS || early_sync != CUDA_SUCCESS, "copy before access refused");

  CUmemLocation here{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 99;
  CHECK(cuMemGetAccess(&flags, &here, va));
  expect_true(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE, "no access before cuMemSetAccess");
  int access = -1;
  CHECK(cuPointerGetAttribute(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, va));
  expect_true(access == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE, "pointer access flags: none yet");
  set_read_write(va, 2 * g, 0);
  CHECK(cuMemGetAccess(&flags, &here, va + g));
  expect_true(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "read-write after cuMemSetAccess");
  CHECK(cuPointerGetAttribute(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, va + g));
  expect_true(access == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE, "pointer access flags: rw");
  unsigned handle_types = 0;
  CHECK(cuPointerGetAttribute(&handle_types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, va + 8));
  expect_true(handle_types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
              "the mapping's allowed handle types are its allocation's");

  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned>(i * 2654435761u);
  CHECK(cuMemcpyHtoD(va, host.data(), 2 * g));
  CHECK(cuMemsetD32(va + g, 0x5a5a5a5au, 16));
  std::vector<unsigned> out(host.size());
  CHECK(cuMemcpyDtoH(out.data(), va, 2 * g));
  for (std::size_t i = 0; i < 16; ++i) host[g / sizeof(unsigned) + i] = 0x5a5a5a5au;
  expect_true(out == host, "bytes written through the mapping read back");

  CUdeviceptr base{};
  size_t range_size = 0;
  CHECK(cuMemGetAddressRange(&base, &range_size, va + 100));
  expect_true(base == va && range_size == 2 * g, "cuMemGetAddressRange of the mapping");
  expect(cuMemFree(va), CUDA_ERROR_INVALID_VALUE, "cuMemFree of a mapping");

  CUmemGenericAllocationHandle retained{};
  CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + 64)));
  expect_true(retained == handle, "retained handle is the mapped one");
  CHECK(cuMemRelease(retained));

  expect(cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE, "free a reservation still mapped");
  expect(cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE, "unmap part of a mapping");
  // Released while mapped: the memory stays until it is unmapped.
  CHECK(cuMemRelease(handle));
  expect(cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE, "release twice");
  CHECK(cuMemcpyDtoH(out.data(), va, 4096));
  expect_true(std::memcmp(out.data(), host.data(), 4096) == 0, "readable after release");
  CHECK(cuMemUnmap(va, 2 * g));
  expect(cuMemMap(va, 2 * g, 0, handle, 0), CUDA_ERROR_INVALID_VALUE, "map a released handle");
  CUresult late = cuMemcpyDtoH(out.data(), va, 4096);
  CUresult late_sync = cuCtxSynchronize();
  expect_true(late != CUDA_SUCCESS || late_sync != CUDA_SUCCESS, "copy after unmap refused");
  CHECK(cuMemAddressFree(va, 4 * g));
  expect_true(free_memory() == free_before, "all memory back after unmap and release");
  return finish("lifecycle");
}

// An expandable allocator: one big reservation, chunks mapped as it grows; copies, a memset and
// a kernel across the boundaries between chunks.
int grow(int chunks) {
  Setup s = setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop);
  const std::size_t reserved = 64 * g;
  CUdeviceptr va{};
  CHECK(cuMemAddressReserve(&va, reserved, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles;
  for (int c = 0; c < chunks; ++c) {
    CUmemGenericAllocationHandle h{};
    CHECK(cuMemCreate(&h, g, &prop, 0));
    CHECK(cuMemMap(va + c * g, g, 0, h, 0));
    set_read_write(va + c * g, g, 0);
    handles.push_back(h);
  }
  const std::size_t mapped = chunks * g;
  // Floats a, b and c, each straddling a boundary between chunks.
  const int n = static_cast<int>(g / sizeof(float) / 2);
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i);
  }
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n);
  const CUdeviceptr da = va + g - bytes / 2;  // chunk 0 into chunk 1
  const CUdeviceptr db = va + 2 * g - bytes / 2;
  const CUdeviceptr dc = va + 3 * g - bytes / 2;
  CHECK(cuMemcpyHtoD(da, a.data(), bytes));
  CHECK(cuMemcpyHtoD(db, b.data(), bytes));
  CHECK(cuMemsetD32(dc, 0xffffffffu, static_cast<std::size_t>(n)));
  vector_add(s, da, db, dc, n);
  std::vector<float> c(n);
  CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += c[i] != 1.5f * static_cast<float>(i);
  expect_true(wrong == 0, "kernel result across chunk boundaries");
  // A device-to-device copy of two chunks' worth, each side crossing two boundaries.
  std::vector<unsigned char> source(2 * g), copied(2 * g);
  CHECK(cuMemcpyDtoH(source.data(), va + g / 2, 2 * g));
  CHECK(cuMemcpyDtoD(va + g / 2 + 2 * g, va + g / 2, 2 * g));
  CHECK(cuMemcpyDtoH(copied.data(), va + g / 2 + 2 * g, 2 * g));
  expect_true(copied == source, "device-to-device copy across chunks");
  // Past the mapped end is not the client's memory.
  CUresult past = cuMemcpyHtoD(va + mapped - 64, a.data(), 128);
  CUresult past_sync = cuCtxSynchronize();
  expect_true(past != CUDA_SUCCESS || past_sync != CUDA_SUCCESS, "copy past the mapped end");
  // Shrinks chunk by chunk, as the allocator gives memory back.
  for (int c = chunks - 1; c >= 0; --c) {
    CHECK(cuMemUnmap(va + c * g, g));
    CHECK(cuMemRelease(handles[static_cast<std::size_t>(c)]));
  }
  CHECK(cuMemAddressFree(va, reserved));
  return finish("grow");
}

// The client's limit (`limit_mib`, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) bounds what it holds in
// physical allocations at once; memory counts until it is released *and* unmapped.
int limit(std::size_t limit_mib) {
  setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t half = (limit_mib / 2) << 20;
  const std::size_t three_quarters = (limit_mib * 3 / 4) << 20;
  CUmemGenericAllocationHandle h{};
  expect(cuMemCreate(&h, (2 * limit_mib) << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY,
         "one allocation over the limit");
  CUmemGenericAllocationHandle first{};
  CHECK(cuMemCreate(&first, half, &prop, 0));
  expect(cuMemCreate(&h, three_quarters, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY,
         "the sum over the limit");
  // Released but still mapped: still held.
  CUdeviceptr va{};
  CHECK(cuMemAddressReserve(&va, half, 0, 0, 0));
  CHECK(cuMemMap(va, half, 0, first, 0));
  CHECK(cuMemRelease(first));
  expect(cuMemCreate(&h, three_quarters, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY,
         "released but mapped memory still counts");
  CHECK(cuMemUnmap(va, half));
  CHECK(cuMemAddressFree(va, half));
  CHECK(cuMemCreate(&h, three_quarters, &prop, 0));  // credited back
  CHECK(cuMemRelease(h));
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  expect_true(free_bytes == total, "nothing held at the end");
  std::printf("total=%zu\n", total);
  return finish("limit");
}

// `megabytes` (rounded down to the granularity) of cuMemCreate memory mapped read-write in a
// reservation `reserve_factor` times as large, every byte 7.
struct Held {
  CUdeviceptr va{};
  CUmemGenericAllocationHandle handle{};
  std::size_t bytes = 0;
};
Held create_and_fill(std::size_t megabytes, std::size_t reserve_factor) {
  setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop);
  Held held;
  held.bytes = (megabytes << 20) / g * g;
  CHECK(cuMemAddressReserve(&held.va, reserve_factor * held.bytes, 0, 0, 0));
  CHECK(cuMemCreate(&held.handle, held.bytes, &prop, 0));
  CHECK(cuMemMap(held.va, held.bytes, 0, held.handle, 0));
  set_read_write(held.va, held.bytes, 0);
  CHECK(cuMemsetD8(held.va, 7, held.bytes));
  CHECK(cuCtxSynchronize());
  return held;
}

// Holds `megabytes` of mapped memory, prints READY with the handle and address, and waits:
// until killed, or (`exit`) exits at once without giving anything back.
int hold(std::size_t megabytes, bool exit_at_once) {
  const Held held = create_and_fill(megabytes, 2);
  std::printf("READY handle=%llu address=%llu free=%zu\n",
              static_cast<unsigned long long>(held.handle),
              static_cast<unsigned long long>(held.va), free_memory());
  std::fflush(stdout);
  if (exit_at_once) std::_Exit(0);  // no cuMemUnmap, no cuMemRelease, no atexit
  for (;;) pause();
}

// As hold, then, once stdin closes, every byte checked (a suspend and resume must keep them).
int hold_check(std::size_t megabytes) {
  const Held held = create_and_fill(megabytes, 1);
  const CUdeviceptr va = held.va;
  const std::size_t bytes = held.bytes;
  std::printf("READY\n");
  std::fflush(stdout);
  char ignored[64];
  while (read(0, ignored, sizeof ignored) > 0) {
  }
  std::vector<unsigned char> host(bytes);
  CHECK(cuMemcpyDtoH(host.data(), va, bytes));
  const auto wrong =
      std::count_if(host.begin(), host.end(), [](unsigned char b) { return b != 7; });
  expect_true(wrong == 0, "every byte held is as written");
  CHECK(cuMemUnmap(va, bytes));
  CHECK(cuMemRelease(held.handle));
  CHECK(cuMemAddressFree(va, bytes));
  return finish("hold-check");
}

// Another client's handle and address name nothing of this client's; exporting and importing
// are refused by policy.
int steal(unsigned long long handle, unsigned long long address) {
  setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop);
  CUdeviceptr va{};
  CHECK(cuMemAddressReserve(&va, g, 0, 0, 0));
  expect(cuMemMap(va, g, 0, handle, 0), CUDA_ERROR_INVALID_VALUE, "map another client's handle");
  CUmemAllocationProp props{};
  expect(cuMemGetAllocationPropertiesFromHandle(&props, handle), CUDA_ERROR_INVALID_VALUE,
         "properties of another client's handle");
  expect(cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE, "release another client's handle");
  CUmemGenericAllocationHandle retained{};
  expect(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(address)),
         CUDA_ERROR_INVALID_VALUE, "retain at another client's address");
  std::vector<char> bytes(4096);
  CUresult read = cuMemcpyDtoH(bytes.data(), address, bytes.size());
  CUresult read_sync = cuCtxSynchronize();
  expect_true(read != CUDA_SUCCESS || read_sync != CUDA_SUCCESS, "read another client's mapping");

  CUmemGenericAllocationHandle own{};
  CHECK(cuMemCreate(&own, g, &prop, 0));
  // Its own memory exports (a real fd); another client's handle id names nothing; an fd that is
  // no shareable handle (stdin) imports nothing; a fabric handle is not served.
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  expect_true(fd > 2, "its own memory exports as an fd");
  if (fd > 2) close(fd);
  expect(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
         CUDA_ERROR_INVALID_VALUE, "export another client's handle");
  expect(cuMemExportToShareableHandle(&fd, own, CU_MEM_HANDLE_TYPE_FABRIC, 0),
         CUDA_ERROR_NOT_SUPPORTED, "export as a fabric handle");
  CUmemGenericAllocationHandle imported{};
  expect_true(
      cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(std::intptr_t{0}),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS,
      "stdin imports nothing");
  // Its own memory still works.
  CHECK(cuMemMap(va, g, 0, own, 0));
  set_read_write(va, g, 0);
  CHECK(cuMemsetD8(va, 3, g));
  CHECK(cuMemcpyDtoH(bytes.data(), va, bytes.size()));
  expect_true(bytes[0] == 3 && bytes[4095] == 3, "own mapping works");
  CHECK(cuMemUnmap(va, g));
  CHECK(cuMemRelease(own));
  CHECK(cuMemAddressFree(va, g));
  return finish("steal");
}

// NCCL's P2P setup between two processes, each on its own GPU (so on two servers): the owner
// creates exportable memory, writes it, exports a POSIX fd and sends it over a unix socket; the
// peer imports it, reserves its own addresses, maps it, gives its GPU access, reads the owner's
// bytes and writes its own into the second half, which the owner then reads back.
constexpr unsigned char kOwnerByte = 0x5a, kPeerByte = 0xc3;

// One byte with room for one descriptor (SCM_RIGHTS), as NCCL passes its buffers' fds.
struct FdMessage {
  char byte = 0;
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

int send_fd_to(int socket, int fd) {
  FdMessage message;
  cmsghdr* header = CMSG_FIRSTHDR(&message.m);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof fd);
  return sendmsg(socket, &message.m, 0) == 1 ? 0 : -1;
}

int receive_fd_from(int socket) {
  FdMessage message;
  if (recvmsg(socket, &message.m, 0) != 1 || CMSG_FIRSTHDR(&message.m) == nullptr) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&message.m)), sizeof fd);
  return fd;
}

int share_owner(const char* path) {
  setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop), bytes = 2 * g;
  CUmemGenericAllocationHandle handle{};
  CUdeviceptr va{};
  CHECK(cuMemCreate(&handle, bytes, &prop, 0));
  CHECK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  CHECK(cuMemMap(va, bytes, 0, handle, 0));
  set_read_write(va, bytes, 0);
  CHECK(cuMemsetD8(va, kOwnerByte, bytes));
  // cuMemsetD8 may return before the GPU has written: a fill still running would overwrite what
  // the peer writes.
  CHECK(cuCtxSynchronize());
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listener, 1) != 0) {
    std::printf("FAIL share-owner: cannot listen at %s\n", path);
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  int peer = accept(listener, nullptr, nullptr);
  expect_true(peer >= 0 && send_fd_to(peer, fd) == 0, "the fd went to the peer");
  close(fd);  // the peer holds its own now, as NCCL closes its copy
  char done = 0;
  expect_true(read(peer, &done, 1) == 1, "the peer said it wrote");
  std::vector<unsigned char> host(bytes);
  CHECK(cuMemcpyDtoH(host.data(), va, bytes));
  expect_true(host[0] == kOwnerByte && host[g - 1] == kOwnerByte, "the first half is the owner's");
  expect_true(host[g] == kPeerByte && host[bytes - 1] == kPeerByte,
              "the second half is what the peer's GPU wrote");
  CHECK(cuMemUnmap(va, bytes));
  CHECK(cuMemRelease(handle));
  CHECK(cuMemAddressFree(va, bytes));
  close(peer);
  close(listener);
  return finish("share-owner");
}

int share_peer(const char* path) {
  setup();
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop), bytes = 2 * g;
  int owner = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path);
  if (connect(owner, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    std::printf("FAIL share-peer: cannot connect to %s\n", path);
    return 1;
  }
  const int fd = receive_fd_from(owner);
  expect_true(fd >= 0, "an fd came");
  CUmemGenericAllocationHandle handle{};
  CHECK(cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(std::intptr_t{fd}),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr va{};
  CHECK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  CHECK(cuMemMap(va, bytes, 0, handle, 0));
  set_read_write(va, bytes, 0);
  unsigned char first = 0;
  CHECK(cuMemcpyDtoH(&first, va + 5, 1));
  expect_true(first == kOwnerByte, "the peer reads the owner's bytes");
  CHECK(cuMemsetD8(va + g, kPeerByte, g));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemUnmap(va, bytes));
  CHECK(cuMemRelease(handle));
  CHECK(cuMemAddressFree(va, bytes));
  const char done = 1;
  expect_true(write(owner, &done, 1) == 1, "told the owner");
  close(owner);
  return finish("share-peer");
}

// VMM memory of GPU 0 given to GPU 1 too (cuMemSetAccess with both GPUs, as JAX's allocator and
// NCCL in one process ask): GPU 1's work writes it, GPU 0 reads what GPU 1 wrote.
int peer_access() {
  setup();
  CUcontext other{};
  CHECK(cuDevicePrimaryCtxRetain(&other, 1));
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop);
  CUmemGenericAllocationHandle handle{};
  CUdeviceptr va{};
  CHECK(cuMemCreate(&handle, g, &prop, 0));
  CHECK(cuMemAddressReserve(&va, g, 0, 0, 0));
  CHECK(cuMemMap(va, g, 0, handle, 0));
  CUmemAccessDesc both[2]{};
  for (int d = 0; d < 2; ++d) {
    both[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    both[d].location.id = d;
    both[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CHECK(cuMemSetAccess(va, g, both, 2));
  unsigned long long flags = 0;
  CHECK(cuMemGetAccess(&flags, &both[1].location, va));
  expect_true(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "GPU 1 has access");
  CHECK(cuMemsetD8(va, 0x11, g));
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxPushCurrent(other));
  CHECK(cuMemsetD8(va + g / 2, 0x22, g / 2));  // on GPU 1's stream, into GPU 0's memory
  CHECK(cuCtxSynchronize());
  CUcontext popped{};
  CHECK(cuCtxPopCurrent(&popped));
  std::vector<unsigned char> host(g);
  CHECK(cuMemcpyDtoH(host.data(), va, g));
  expect_true(host[0] == 0x11 && host[g / 2 - 1] == 0x11, "GPU 0's half");
  expect_true(host[g / 2] == 0x22 && host[g - 1] == 0x22, "GPU 1 wrote its half");
  CHECK(cuMemUnmap(va, g));
  CHECK(cuMemRelease(handle));
  CHECK(cuMemAddressFree(va, g));
  return finish("peer-access");
}

// GPU 0's memory mapped into a reservation made with GPU 1 current (NCCL in one process maps its
// peers' buffers so), given both GPUs' access: GPU 1's work writes it through that mapping, GPU 0
// reads it through its own.
int cross_map() {
  setup();
  CUcontext other{};
  CHECK(cuDevicePrimaryCtxRetain(&other, 1));
  const CUmemAllocationProp prop = device_prop(0);
  const std::size_t g = granularity(prop);
  CUmemGenericAllocationHandle handle{};
  CUdeviceptr own{}, there{};
  CHECK(cuMemCreate(&handle, g, &prop, 0));
  CHECK(cuMemAddressReserve(&own, g, 0, 0, 0));
  CHECK(cuMemMap(own, g, 0, handle, 0));
  set_read_write(own, g, 0);
  CHECK(cuMemsetD8(own, 0x33, g));
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxPushCurrent(other));
  CHECK(cuMemAddressReserve(&there, g, 0, 0, 0));
  CHECK(cuMemMap(there, g, 0, handle, 0));
  CUmemAccessDesc both[2]{};
  for (int d = 0; d < 2; ++d) {
    both[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    both[d].location.id = d;
    both[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CHECK(cuMemSetAccess(there, g, both, 2));
  unsigned char seen = 0;
  CHECK(cuMemcpyDtoH(&seen, there + 9, 1));
  expect_true(seen == 0x33, "GPU 1's mapping shows GPU 0's bytes");
  CHECK(cuMemsetD8(there, 0x44, g / 2));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemUnmap(there, g));
  CHECK(cuMemAddressFree(there, g));
  CUcontext popped{};
  CHECK(cuCtxPopCurrent(&popped));
  std::vector<unsigned char> host(g);
  CHECK(cuMemcpyDtoH(host.data(), own, g));
  expect_true(host[0] == 0x44 && host[g / 2 - 1] == 0x44, "GPU 1 wrote through its mapping");
  expect_true(host[g / 2] == 0x33, "the rest is GPU 0's");
  CHECK(cuMemUnmap(own, g));
  CHECK(cuMemRelease(handle));
  CHECK(cuMemAddressFree(own, g));
  return finish("cross-map");
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "lifecycle";
  auto arg = [&](int i) { return argc > i ? std::strtoull(argv[i], nullptr, 0) : 0ull; };
  if (mode == "lifecycle") return lifecycle();
  if (mode == "grow") return grow(arg(2) ? static_cast<int>(arg(2)) : 5);
  if (mode == "limit") return limit(arg(2));
  if (mode == "hold") return hold(arg(2) ? arg(2) : 64, false);
  if (mode == "hold-exit") return hold(arg(2) ? arg(2) : 64, true);
  if (mode == "hold-check") return hold_check(arg(2) ? arg(2) : 64);
  if (mode == "steal") return steal(arg(2), arg(3));
  if (mode == "share-owner" && argc > 2) return share_owner(argv[2]);
  if (mode == "peer-access") return peer_access();
  if (mode == "cross-map") return cross_map();
  if (mode == "share-peer" && argc > 2) return share_peer(argv[2]);
  std::printf("FAIL unknown mode %s\n", mode.c_str());
  return 2;
}

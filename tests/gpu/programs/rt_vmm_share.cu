// VMM memory shared between two processes by fd on one GPU, as NCCL's P2P transport shares its
// buffers: the owner creates exportable memory, fills it and sends the fd over a unix socket; the
// peer (a forked child) imports it, maps it, reads the owner's bytes and writes the second half;
// the owner reads what the peer wrote. Under the shim the fd is a handle of the server's registry
// (docs/vmm.md, "Export and import"). Driver API.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                         \
  do {                                                                \
    CUresult r_ = (x);                                                \
    if (r_ != CUDA_SUCCESS) {                                         \
      std::printf("rt_vmm_share: %s: %s -> %d FAIL\n", role, #x, r_); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

static const char* role = "owner";

static int send_fd(int s, int fd) {
  char byte = 1;
  iovec io{&byte, 1};
  char buf[CMSG_SPACE(sizeof(int))]{};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = buf;
  m.msg_controllen = sizeof buf;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(s, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int s) {
  char byte = 0;
  iovec io{&byte, 1};
  char buf[CMSG_SPACE(sizeof(int))]{};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = buf;
  m.msg_controllen = sizeof buf;
  if (recvmsg(s, &m, 0) != 1) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
  return fd;
}

static int common(CUcontext* ctx, CUmemAllocationProp* prop, size_t* g) {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(ctx, dev));
  CK(cuCtxSetCurrent(*ctx));
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = 0;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CK(cuMemGetAllocationGranularity(g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return 0;
}

static int map_rw(CUdeviceptr* va, size_t bytes, CUmemGenericAllocationHandle h) {
  CK(cuMemAddressReserve(va, bytes, 0, 0, 0));
  CK(cuMemMap(*va, bytes, 0, h, 0));
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(*va, bytes, &a, 1));
  return 0;
}

int main() {
  // No driver call before the fork: a child may not use what its parent initialized.
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t child = fork();
  CUcontext ctx;
  CUmemAllocationProp prop;
  size_t g = 0;
  if (child == 0) {
    role = "peer";
    if (common(&ctx, &prop, &g)) return 1;
    int fd = recv_fd(sv[1]);
    char name[128] = {};
    std::snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    char link[128] = {};
    readlink(name, link, sizeof link - 1);
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void*)(long)fd,
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr va;
    if (map_rw(&va, 2 * g, h)) return 1;
    unsigned char first = 0;
    CK(cuMemcpyDtoH(&first, va + 5, 1));
    CK(cuMemsetD8(va + g, 0x77, g));
    CK(cuCtxSynchronize());
    CK(cuMemUnmap(va, 2 * g));
    CK(cuMemRelease(h));
    CK(cuMemAddressFree(va, 2 * g));
    char done = 1;
    write(sv[1], &done, 1);
    (void)link;
    return first == 0x5a ? 0 : 1;
  }
  if (common(&ctx, &prop, &g)) return 1;
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, 2 * g, &prop, 0));
  CUdeviceptr va;
  if (map_rw(&va, 2 * g, h)) return 1;
  CK(cuMemsetD8(va, 0x5a, 2 * g));
  CK(cuCtxSynchronize());
  int fd = -1;
  CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  send_fd(sv[0], fd);
  close(fd);
  char done = 0;
  read(sv[0], &done, 1);
  std::vector<unsigned char> host(2 * g);
  CK(cuMemcpyDtoH(host.data(), va, 2 * g));
  int status = 0;
  waitpid(child, &status, 0);
  const bool ok = host[0] == 0x5a && host[g] == 0x77 && host[2 * g - 1] == 0x77 &&
                  WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("rt_vmm_share: first=%#x second=%#x peer_ok=%d %s\n", host[0], host[g],
              WIFEXITED(status) && WEXITSTATUS(status) == 0, ok ? "PASS" : "FAIL");
  CK(cuMemUnmap(va, 2 * g));
  CK(cuMemRelease(h));
  return ok ? 0 : 1;
}

#include "memory_peek.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>

namespace darktrace {

std::size_t peek(std::uintptr_t address, unsigned char* out, std::size_t n) {
  // The kernel transfers whole iovec elements only, so the remote range is split at its page
  // boundary: a pointer 16 bytes before an unmapped page still shows those 16 bytes.
  const std::uintptr_t page = std::uintptr_t(sysconf(_SC_PAGESIZE));
  const std::uintptr_t page_end = (address / page + 1) * page;
  const std::size_t first = page_end - address < n ? page_end - address : n;
  iovec local{out, n};
  iovec remote[2] = {{reinterpret_cast<void*>(address), first},
                     {reinterpret_cast<void*>(page_end), n - first}};
  const ssize_t got = process_vm_readv(getpid(), &local, 1, remote, first < n ? 2 : 1, 0);
  return got > 0 ? std::size_t(got) : 0;
}

bool is_code(std::uintptr_t address) {
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return false;
  bool code = false;
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  char perms[8] = {};
  char rest[4096];
  while (std::fscanf(maps, "%" SCNxPTR "-%" SCNxPTR " %7s", &begin, &end, perms) == 3) {
    if (address >= begin && address < end) {
      code = perms[2] == 'x';
      break;
    }
    if (std::fgets(rest, sizeof rest, maps) == nullptr) break;  // the rest of the line
  }
  std::fclose(maps);
  return code;
}

}  // namespace darktrace

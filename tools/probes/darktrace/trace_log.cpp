#include "trace_log.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace darktrace {
namespace {

std::mutex open_mutex;
std::atomic<int> trace_fd{-1};
std::atomic<pid_t> trace_pid{0};

std::string base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

std::string exe_path() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "?";
  path[n] = '\0';
  return path;
}

// The fd of this process's file. A forked child inherits the parent's fd; its pid differs, so
// it opens a file of its own instead of writing into the parent's.
int fd_for_this_process() {
  const pid_t pid = getpid();
  if (trace_pid.load(std::memory_order_acquire) == pid) return trace_fd.load();
  std::lock_guard lock(open_mutex);
  if (trace_pid.load() == pid) return trace_fd.load();
  const char* dir = std::getenv("DARKTRACE_DIR");
  const std::string path =
      format("%s/darktrace.%d.txt", dir != nullptr && *dir != '\0' ? dir : "/tmp", int(pid));
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "darktrace: cannot open %s: %s; tracing to stderr\n", path.c_str(),
                 std::strerror(errno));
  }
  const int old = trace_fd.exchange(fd < 0 ? STDERR_FILENO : fd);
  if (old > STDERR_FILENO && trace_pid.load() != 0) close(old);  // the parent's, in a child
  trace_pid.store(pid, std::memory_order_release);
  const char* tables = std::getenv("DARKTRACE_TABLES");
  const std::string header = format("# darktrace pid=%d exe=%s DARKTRACE_TABLES=%s\n", int(pid),
                                    exe_path().c_str(), tables != nullptr ? tables : "");
  (void)!::write(trace_fd.load(), header.data(), header.size());
  return trace_fd.load();
}

}  // namespace

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? std::size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

void write_line(const std::string& line) {
  const int fd = fd_for_this_process();
  std::string with_newline = line;
  with_newline += '\n';
  (void)!::write(fd, with_newline.data(), with_newline.size());
}

std::string where(const void* address, bool with_symbol) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fbase == nullptr) {
    return format("?%p", address);
  }
  // The main program's link map entry has an empty name.
  const std::string object = info.dli_fname != nullptr && *info.dli_fname != '\0'
                                 ? base_name(info.dli_fname)
                                 : base_name(exe_path().c_str());
  std::string out = format(
      "%s+0x%zx", object.c_str(),
      std::size_t(static_cast<const char*>(address) - static_cast<const char*>(info.dli_fbase)));
  if (with_symbol && info.dli_sname != nullptr) {
    out += format(
        "(%s+0x%zx)", info.dli_sname,
        std::size_t(static_cast<const char*>(address) - static_cast<const char*>(info.dli_saddr)));
  }
  return out;
}

std::string hex(const unsigned char* bytes, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2 + n / 8);
  for (std::size_t i = 0; i < n; ++i) {
    if (i != 0 && i % 8 == 0) out += '_';  // one 8-byte word per group
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 0xf];
  }
  return out;
}

std::uint64_t thread_id() {
  thread_local const std::uint64_t tid = std::uint64_t(syscall(SYS_gettid));
  return tid;
}

}  // namespace darktrace

// What the test driver's tests share: the library loaded the way the server loads a driver, a
// working context, and ways to run a case in a process of its own.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "broker/server/driver/driver_table.hpp"

namespace mpsshim::testdriver::test {

// dlopen()ed from $MPSSHIM_TESTDRIVER_LIB, every entry point of the server's list resolved by name.
struct LoadedDriver {
  server::DriverTable api;
  int (*live_objects)() = nullptr;
  void* handle = nullptr;
};
LoadedDriver& driver();

// The CUresult's name, for assertions that read well when they fail.
std::string error_name(CUresult r);

#define REQUIRE_CU(call) REQUIRE(::mpsshim::testdriver::test::error_name(call) == "CUDA_SUCCESS")
#define CHECK_CU(call, expected) CHECK(::mpsshim::testdriver::test::error_name(call) == #expected)

// Runs the hidden test case `name` in a fresh process (fork, then exec of this binary) with `env`
// added to the environment. Returns its exit status, or 128 + the signal that ended it.
int run_isolated(const std::string& name,
                 const std::vector<std::pair<std::string, std::string>>& env = {});
// Runs `body` in a forked child that does not exec; same return convention.
int run_forked(const std::function<int()>& body);

// A context to work in: a device's primary context current on this thread, a green context over
// all of its SMs with a stream, and a loaded module. The destructor destroys them and releases
// the primary context, which frees whatever else the test left in it.
class Session {
 public:
  explicit Session(CUdevice device = 0);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const server::DriverTable& sut;
  CUdevice device = 0;
  CUcontext ctx = nullptr;
  CUgreenCtx green = nullptr;
  CUstream stream = nullptr;
  CUmodule module = nullptr;

  CUcontext green_ctx = nullptr;  // the green context as a CUcontext

  CUfunction function(const char* name);
  // An event of the green context, so that it can be recorded on `stream` (an event and the
  // stream it is recorded on must share a context).
  CUevent event(unsigned flags);
  CUdeviceptr alloc(std::size_t bytes);
  template <class T>
  void upload(CUdeviceptr dst, const std::vector<T>& src) {
    upload_bytes(dst, src.data(), src.size() * sizeof(T));
  }
  template <class T>
  std::vector<T> download(CUdeviceptr src, std::size_t count) {
    std::vector<T> out(count);
    download_bytes(out.data(), src, count * sizeof(T));
    return out;
  }
  void sync();

 private:
  void upload_bytes(CUdeviceptr dst, const void* src, std::size_t bytes);
  void download_bytes(void* dst, CUdeviceptr src, std::size_t bytes);
};

// A green context over `groups` of a split by `min_count` SMs, with one stream.
struct GreenStream {
  CUgreenCtx green = nullptr;
  CUstream stream = nullptr;
  unsigned sm_count = 0;
};
GreenStream make_green_stream(CUdevice device, unsigned min_count, unsigned groups, unsigned flags);
// An event created with `green` current, then the previous context current again.
CUevent make_event(CUgreenCtx green, unsigned flags, CUcontext restore);
void destroy_green_stream(const GreenStream& g);

}  // namespace mpsshim::testdriver::test

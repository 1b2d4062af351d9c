#include "tests/testdriver/test_support.hpp"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <stdexcept>

extern char** environ;

namespace mpsshim::testdriver::test {

LoadedDriver& driver() {
  static LoadedDriver* loaded = [] {
    const char* path = std::getenv("MPSSHIM_TESTDRIVER_LIB");
    if (path == nullptr) throw std::runtime_error("MPSSHIM_TESTDRIVER_LIB is not set");
    auto* d = new LoadedDriver;
    d->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (d->handle == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
#define MPSSHIM_TEST_RESOLVE(name, ret, params) \
  d->api.name = reinterpret_cast<ret(CUDAAPI*) params>(dlsym(d->handle, #name));
    MPSSHIM_DRIVER_FUNCTIONS(MPSSHIM_TEST_RESOLVE)
#undef MPSSHIM_TEST_RESOLVE
    d->live_objects =
        reinterpret_cast<int (*)()>(dlsym(d->handle, "mpsshim_testdriver_live_objects"));
    return d;
  }();
  return *loaded;
}

std::string error_name(CUresult r) {
  const char* name = nullptr;
  if (driver().api.cuGetErrorName == nullptr ||
      driver().api.cuGetErrorName(r, &name) != CUDA_SUCCESS)
    return "CUresult " + std::to_string(static_cast<int>(r));
  return name;
}

namespace {

int wait_for(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

int run_isolated(const std::string& name,
                 const std::vector<std::pair<std::string, std::string>>& env) {
  // Everything exec needs is built before fork: the parent has stream threads.
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    bool overridden = false;
    for (const auto& [key, value] : env) overridden |= var.starts_with(key + "=");
    if (!overridden) vars.push_back(var);
  }
  for (const auto& [key, value] : env) vars.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::string spec = name;
  std::string warn = "-w";
  std::string no_tests = "NoTests";  // a misspelt name fails instead of passing vacuously
  std::vector<char*> argv{self.data(), spec.data(), warn.data(), no_tests.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    execve(self.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  return wait_for(pid);
}

int run_forked(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return wait_for(pid);
}

Session::Session(CUdevice dev) : sut(driver().api), device(dev) {
  REQUIRE_CU(sut.cuInit(0));
  REQUIRE_CU(sut.cuDevicePrimaryCtxRetain(&ctx, device));
  REQUIRE_CU(sut.cuCtxSetCurrent(ctx));
  CUdevResource all{};
  REQUIRE_CU(sut.cuDeviceGetDevResource(device, &all, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResourceDesc desc = nullptr;
  REQUIRE_CU(sut.cuDevResourceGenerateDesc(&desc, &all, 1));
  REQUIRE_CU(sut.cuGreenCtxCreate(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  REQUIRE_CU(sut.cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0));
  REQUIRE_CU(sut.cuCtxFromGreenCtx(&green_ctx, green));
  static constexpr char kImage[] = "// any image: kernels are found by name\n.version 8.0\n";
  REQUIRE_CU(sut.cuModuleLoadData(&module, kImage));
}

Session::~Session() {
  if (stream != nullptr) sut.cuStreamDestroy_v2(stream);
  if (green != nullptr) sut.cuGreenCtxDestroy(green);
  if (module != nullptr) sut.cuModuleUnload(module);
  if (ctx != nullptr) sut.cuDevicePrimaryCtxRelease_v2(device);
}

CUfunction Session::function(const char* name) {
  CUfunction f = nullptr;
  REQUIRE_CU(sut.cuModuleGetFunction(&f, module, name));
  return f;
}

CUevent Session::event(unsigned flags) {
  return make_event(green, flags, ctx);
}

CUdeviceptr Session::alloc(std::size_t bytes) {
  CUdeviceptr p = 0;
  REQUIRE_CU(sut.cuMemAlloc_v2(&p, bytes));
  return p;
}

void Session::sync() {
  REQUIRE_CU(sut.cuStreamSynchronize(stream));
}

void Session::upload_bytes(CUdeviceptr dst, const void* src, std::size_t bytes) {
  REQUIRE_CU(sut.cuMemcpyHtoDAsync_v2(dst, src, bytes, stream));
}

// Into pageable memory: the call returns once the bytes are there, as with the real driver.
void Session::download_bytes(void* dst, CUdeviceptr src, std::size_t bytes) {
  REQUIRE_CU(sut.cuMemcpyDtoHAsync_v2(dst, src, bytes, stream));
}

GreenStream make_green_stream(CUdevice device, unsigned min_count, unsigned groups,
                              unsigned flags) {
  const auto& sut = driver().api;
  CUdevResource all{};
  REQUIRE_CU(sut.cuDeviceGetDevResource(device, &all, CU_DEV_RESOURCE_TYPE_SM));
  std::vector<CUdevResource> parts(groups);
  unsigned made = groups;
  REQUIRE_CU(sut.cuDevSmResourceSplitByCount(parts.data(), &made, &all, nullptr, flags, min_count));
  REQUIRE(made == groups);
  CUdevResourceDesc desc = nullptr;
  REQUIRE_CU(sut.cuDevResourceGenerateDesc(&desc, parts.data(), made));
  GreenStream g;
  for (const auto& p : parts) g.sm_count += p.sm.smCount;
  REQUIRE_CU(sut.cuGreenCtxCreate(&g.green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  REQUIRE_CU(sut.cuGreenCtxStreamCreate(&g.stream, g.green, CU_STREAM_NON_BLOCKING, 0));
  return g;
}

CUevent make_event(CUgreenCtx green, unsigned flags, CUcontext restore) {
  const auto& sut = driver().api;
  CUcontext green_ctx = nullptr;
  REQUIRE_CU(sut.cuCtxFromGreenCtx(&green_ctx, green));
  REQUIRE_CU(sut.cuCtxSetCurrent(green_ctx));
  CUevent event = nullptr;
  const CUresult created = sut.cuEventCreate(&event, flags);
  REQUIRE_CU(sut.cuCtxSetCurrent(restore));
  REQUIRE_CU(created);
  return event;
}

void destroy_green_stream(const GreenStream& g) {
  const auto& sut = driver().api;
  REQUIRE_CU(sut.cuStreamDestroy_v2(g.stream));
  REQUIRE_CU(sut.cuGreenCtxDestroy(g.green));
}

}  // namespace mpsshim::testdriver::test

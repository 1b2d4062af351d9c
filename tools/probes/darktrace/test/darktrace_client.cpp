// The program darktrace traces in its test: finds cuGetExportTable on the fake driver the way
// libraries do (argv[1]: "procaddress", "dlsym" or "linked"), calls the tables' slots with known
// arguments and checks every answer, so that a wrapper that loses an argument or a return value
// fails here. DARKTRACE_EXPECT_TRACED lists the UUID prefixes whose tables must come back as
// copies; all others must be the driver's own. Prints the addresses it passed, for the test to
// find in the trace, then "darktrace_client: PASS".
#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

using GetExportTableFn = CUresult (*)(const void**, const CUuuid*);
using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
using Sum8Fn = std::uint64_t (*)(std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t,
                                 std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t);
using FillFn = int (*)(unsigned char*, int, std::size_t);
using UnaryFn = long (*)(long);
using DriverTableFn = const void* (*)(const char*);

constexpr const char* kToolsModule = "6e163fbeb958444d835ce182aff1991e";
constexpr const char* kHeaderless = "c693336e1121df11a8c368f355d89593";
constexpr const char* kRuntime = "6bd5fb6c5bf4e74a8987d93912fd9df9";
constexpr const char* kUnknown = "0123456789abcdef0123456789abcdef";

int failures = 0;
#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "darktrace_client: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                       \
    }                                                                                   \
  } while (0)

CUuuid uuid_of(const char* hex) {
  CUuuid id{};
  for (int i = 0; i < 16; ++i) {
    char byte[3] = {hex[2 * i], hex[2 * i + 1], 0};
    id.bytes[i] = char(std::strtoul(byte, nullptr, 16));
  }
  return id;
}

bool expect_traced(const char* uuid) {
  const char* list = std::getenv("DARKTRACE_EXPECT_TRACED");
  return list != nullptr && std::strstr(list, std::string(uuid, 8).c_str()) != nullptr;
}

template <typename Fn>
Fn slot(const void* table, int index) {
  return reinterpret_cast<Fn>(static_cast<const std::uint64_t*>(table)[index]);
}

const void* table_of(GetExportTableFn get, const char* uuid, DriverTableFn driver_table) {
  const CUuuid id = uuid_of(uuid);
  const void* table = nullptr;
  CHECK(get(&table, &id) == CUDA_SUCCESS);
  const void* again = nullptr;
  CHECK(get(&again, &id) == CUDA_SUCCESS);
  CHECK(again == table);  // the same address on every call
  const void* real = driver_table(uuid);
  if (expect_traced(uuid)) {
    CHECK(table != real);
  } else {
    CHECK(table == real);
  }
  return table;
}

}  // namespace

extern "C" CUresult cuGetExportTable(const void**, const CUuuid*);  // for "linked"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: darktrace_client procaddress|dlsym|linked FAKE_DRIVER.so\n");
    return 2;
  }
  const std::string how = argv[1];
  void* driver = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::fprintf(stderr, "darktrace_client: %s\n", dlerror());
    return 2;
  }
  const auto driver_table = reinterpret_cast<DriverTableFn>(dlsym(driver, "fake_driver_table"));
  GetExportTableFn get = nullptr;
  if (how == "procaddress") {  // as cudart
    const auto gpa = reinterpret_cast<GetProcAddressFn>(dlsym(driver, "cuGetProcAddress_v2"));
    CHECK(gpa(std::string("cuGetExportTable").c_str(), reinterpret_cast<void**>(&get), 13000, 0,
              nullptr) == CUDA_SUCCESS);
    // Other entry points are the driver's own.
    void* version_fn = nullptr;
    CHECK(gpa("cuDriverGetVersion", &version_fn, 13000, 0, nullptr) == CUDA_SUCCESS);
    CHECK(version_fn == dlsym(driver, "cuDriverGetVersion"));
    // cuGetProcAddress asked of itself answers the traced lookup again.
    void* self = nullptr;
    CHECK(gpa("cuGetProcAddress", &self, 13000, 0, nullptr) == CUDA_SUCCESS);
    CHECK(self == reinterpret_cast<void*>(gpa));
  } else if (how == "dlsym") {
    get = reinterpret_cast<GetExportTableFn>(dlsym(driver, "cuGetExportTable"));
  } else if (how == "linked") {
    get = &cuGetExportTable;
  }
  if (get == nullptr) {
    std::fprintf(stderr, "darktrace_client: no cuGetExportTable (%s)\n", how.c_str());
    return 1;
  }

  // The sized table: [size, sum8, NULL, fill, &data].
  const void* tools = table_of(get, kToolsModule, driver_table);
  const void* tools_real = driver_table(kToolsModule);
  CHECK(slot<std::uint64_t>(tools, 0) == 40);
  CHECK(slot<void*>(tools, 2) == nullptr);
  CHECK(slot<void*>(tools, 4) == slot<void*>(tools_real, 4));
  CHECK(slot<Sum8Fn>(tools, 1)(0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88) == 0x264);

  unsigned char buffer[64];
  std::memset(buffer, 0x5a, sizeof buffer);
  CHECK(slot<FillFn>(tools, 3)(buffer, 0xab, sizeof buffer) == 0);
  CHECK(buffer[0] == 0xab && buffer[63] == 0xab);

  // Pointers that must not be read whole, or at all: 16 bytes before a PROT_NONE page, and
  // the page itself.
  const long page = sysconf(_SC_PAGESIZE);
  auto* pages = static_cast<unsigned char*>(
      mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  CHECK(pages != MAP_FAILED);
  CHECK(mprotect(pages + page, page, PROT_NONE) == 0);
  unsigned char* edge = pages + page - 16;
  std::memset(edge, 0xe7, 16);
  unsigned char* guard = pages + page;
  const auto e = reinterpret_cast<std::uint64_t>(edge);
  const auto g = reinterpret_cast<std::uint64_t>(guard);
  CHECK(slot<Sum8Fn>(tools, 1)(e, g, 0, 0, 0, 0, 0, 0) == e + g);

  // Two more threads: each numbers its calls from 1.
  auto three_sums = [&] {
    for (std::uint64_t i = 1; i <= 3; ++i)
      CHECK(slot<Sum8Fn>(tools, 1)(i, 0, 0, 0, 0, 0, 0, 0) == i);
  };
  std::thread first(three_sums);
  std::thread second(three_sums);
  first.join();
  second.join();

  // The headerless table: [twice, negate, NULL].
  const void* headerless = table_of(get, kHeaderless, driver_table);
  CHECK(slot<UnaryFn>(headerless, 0)(21) == 42);
  CHECK(slot<UnaryFn>(headerless, 1)(5) == -5);
  CHECK(slot<void*>(headerless, 2) == nullptr);

  const void* runtime = table_of(get, kRuntime, driver_table);
  CHECK(slot<std::uint64_t>(runtime, 0) == 16);

  const CUuuid unknown = uuid_of(kUnknown);
  const void* none = &unknown;
  CHECK(get(&none, &unknown) == CUDA_ERROR_INVALID_VALUE);
  CHECK(none == nullptr);

  std::printf("buffer=%p edge=%p guard=%p pid=%d\n", static_cast<void*>(buffer),
              static_cast<void*>(edge), static_cast<void*>(guard), int(getpid()));
  std::printf("darktrace_client: %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

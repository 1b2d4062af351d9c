// The cuGetExportTable contract and the served tables' slots (docs/private-tables.md).
#include <pthread.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "libshim/client_view.hpp"
#include "libshim/darkapi/fatbin_format.hpp"
#include "libshim/darkapi/integrity.hpp"
#include "tests/darkapi/fake_core.hpp"
#include "tests/darkapi/tables.hpp"

using namespace mpsshim::test;
namespace fatbin = mpsshim::shim::fatbin;

namespace {

using TrapFn = CUresult (*)();

CUresult ask(std::string_view hex, const void** out) {
  const CUuuid id = uuid_of(hex);
  return cuGetExportTable(out, &id);
}

}  // namespace

TEST_CASE("export tables: same address every call, real size words", "[export]") {
  const std::array<std::pair<std::string_view, std::uintptr_t>, 7> sized{{
      {kCudartInterface, 104},
      {kCallbackHooks, 56},
      {kToolsTls, 24},
      {kContextChecks, 120},
      {kIntegrityCheck, 24},
      {kToolsContext, 744},
      {kToolsModule, 792},
  }};
  for (const auto& [hex, size] : sized) {
    INFO(hex);
    const std::uintptr_t* first = export_table(hex);
    CHECK(first[0] == size);
    CHECK(export_table(hex) == first);
    for (std::size_t slot = 1; slot < size / 8; ++slot) {
      const bool null_in_real_driver = (hex == kCudartInterface && slot == 10) ||
                                       (hex == kToolsContext && slot == 91) ||
                                       (hex == kToolsModule && slot == 93);
      INFO("slot " << slot);
      CHECK((first[slot] == 0) == null_in_real_driver);
    }
  }
}

TEST_CASE("export tables: CONTEXT_LOCAL_STORAGE has no size word", "[export]") {
  const std::uintptr_t* t = export_table(kContextLocalStorage);
  CHECK(export_table(kContextLocalStorage) == t);
  // [put, delete, get, NULL]: slot 0 is a function, not 24 or 32.
  CHECK(t[0] > 4096);
  CHECK(t[1] != 0);
  CHECK(t[2] != 0);
  CHECK(t[3] == 0);
}

TEST_CASE("export tables: refused UUIDs give NULL and INVALID_VALUE", "[export]") {
  for (const std::string_view hex : {
           "f8cff95121468b4eb9e2fb469e7c0dd9",  // F8
           "69a28e9f24498b47b030c5da330ea4e9",  // NVML
           "da9151d33ae6cc41a5c04f26d533e328",  // NVRTC
           "195bcbf4d67d024aacc51d29cea631ae",  // HEAP_ACCESS (absent on 580 too)
           "0ca50b8c1004929a89a7d0df10e77286",  // CTX_CREATE_BYPASS
           "00000000000000000000000000000000",
           "6bd5fb6c5bf4e74a8987d93912fd9df8",  // one bit off CUDART_INTERFACE
       }) {
    INFO(hex);
    const void* table = &hex;
    CHECK(ask(hex, &table) == CUDA_ERROR_INVALID_VALUE);
    CHECK(table == nullptr);
    table = &hex;
    CHECK(ask(hex, &table) == CUDA_ERROR_INVALID_VALUE);  // logged once, refused always
    CHECK(table == nullptr);
  }
}

TEST_CASE("export tables: NULL arguments are INVALID_VALUE", "[export]") {
  const CUuuid id = uuid_of(kCudartInterface);
  CHECK(cuGetExportTable(nullptr, &id) == CUDA_ERROR_INVALID_VALUE);
  const void* table = &id;
  CHECK(cuGetExportTable(&table, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(table == nullptr);
}

TEST_CASE("export tables: unknown slots are traps returning NOT_SUPPORTED", "[export]") {
  CHECK(slot_fn<TrapFn>(export_table(kCudartInterface), 3)() == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(slot_fn<TrapFn>(export_table(kCudartInterface), 11)() == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(slot_fn<TrapFn>(export_table(kContextChecks), 14)() == CUDA_ERROR_NOT_SUPPORTED);
  const std::uintptr_t* tools = export_table(kToolsContext);
  for (const std::size_t slot : {1u, 2u, 5u, 39u, 51u, 90u, 92u}) {
    INFO("slot " << slot);
    CHECK(slot_fn<TrapFn>(tools, slot)() == CUDA_ERROR_NOT_SUPPORTED);
  }
  // Each slot has its own function, so that the log can name it.
  CHECK(tools[1] != tools[2]);
}

TEST_CASE("CUDART_INTERFACE slot 2: primary context handle", "[export]") {
  FakeCore& core = reset_fake_core();
  core.primary = {fake_context(7), fake_context(8)};
  const auto get_primary =
      slot_fn<CUresult (*)(CUcontext*, CUdevice)>(export_table(kCudartInterface), 2);
  CUcontext ctx = nullptr;
  CHECK(get_primary(&ctx, 1) == CUDA_SUCCESS);
  CHECK(ctx == fake_context(8));
  CHECK(get_primary(&ctx, 2) == CUDA_ERROR_INVALID_DEVICE);  // the core's answer
  CHECK(get_primary(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(mpsshim::shim::current_context() == nullptr);  // not made current
}

namespace {

using LoadWrapperFn = CUresult (*)(CUmodule*, const void*);
using LoadWrapperExtFn = CUresult (*)(CUmodule*, const void*, void*, void*, std::uint32_t);
using LoadContainerFn = CUresult (*)(const void*, CUmodule*, void*, void*, std::uint32_t);

// A minimal container: header only, no entries. The fake driver never looks inside.
alignas(8) constexpr std::array<std::uint8_t, 16> kContainer{0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
const void* const kPrelinked[] = {kContainer.data(), nullptr};

}  // namespace

TEST_CASE("CUDART_INTERFACE slots 1 and 6: module from a wrapper", "[export]") {
  const std::uintptr_t* t = export_table(kCudartInterface);
  const auto slot1 = slot_fn<LoadWrapperFn>(t, 1);
  const auto slot6 = slot_fn<LoadWrapperExtFn>(t, 6);
  const fatbin::Wrapper v1{fatbin::kWrapperMagic, 1, kContainer.data(), nullptr};
  const fatbin::Wrapper v2{fatbin::kWrapperMagic, 2, kContainer.data(), kPrelinked};

  SECTION("v1 loads the container at data") {
    FakeCore& core = reset_fake_core();
    CUmodule module = nullptr;
    CHECK(slot1(&module, &v1) == CUDA_SUCCESS);
    CHECK(core.module_image == kContainer.data());
    CHECK(module == fake_module());
    core.module_image = nullptr;
    CHECK(slot6(&module, &v1, nullptr, nullptr, 0) == CUDA_SUCCESS);
    CHECK(core.module_image == kContainer.data());
  }
  SECTION("v2 goes through cuLibraryLoadData with the wrapper itself") {
    FakeCore& core = reset_fake_core();
    CUmodule module = nullptr;
    CHECK(slot1(&module, &v2) == CUDA_SUCCESS);
    CHECK(core.library_code == &v2);
    CHECK(core.library_of_module == fake_library());
    CHECK(core.module_image == nullptr);
    CHECK(module == fake_module());
  }
  SECTION("errors") {
    FakeCore& core = reset_fake_core();
    CUmodule module = nullptr;
    CHECK(slot1(nullptr, &v1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(slot1(&module, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(slot1(&module, kContainer.data()) == CUDA_ERROR_INVALID_IMAGE);  // not a wrapper
    const fatbin::Wrapper v3{fatbin::kWrapperMagic, 3, kContainer.data(), nullptr};
    CHECK(slot1(&module, &v3) == CUDA_ERROR_INVALID_IMAGE);
    int dummy = 0;
    CHECK(slot6(&module, &v1, &dummy, nullptr, 0) == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(slot6(&module, &v1, nullptr, nullptr, 1) == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(core.module_image == nullptr);
    core.module_result = CUDA_ERROR_NO_BINARY_FOR_GPU;  // the driver's error comes back
    CHECK(slot1(&module, &v1) == CUDA_ERROR_NO_BINARY_FOR_GPU);
  }
}

TEST_CASE("CUDART_INTERFACE slots 7, 8 and 12", "[export]") {
  FakeCore& core = reset_fake_core();
  const std::uintptr_t* t = export_table(kCudartInterface);
  slot_fn<void (*)(std::uintptr_t)>(t, 7)(0x1234);  // a no-op
  const auto slot8 = slot_fn<LoadContainerFn>(t, 8);
  CUmodule module = nullptr;
  CHECK(slot8(kContainer.data(), &module, nullptr, nullptr, 0) == CUDA_SUCCESS);
  CHECK(core.module_image == kContainer.data());
  CHECK(module == fake_module());
  CHECK(slot8(nullptr, &module, nullptr, nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(slot8(kContainer.data(), nullptr, nullptr, nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(slot_fn<CUresult (*)()>(t, 12)() == CUDA_SUCCESS);
}

TEST_CASE("TOOLS_RUNTIME_CALLBACK_HOOKS: static zeroed buffers", "[export]") {
  using GetBufferFn = void* (*)(void**, std::size_t*);
  const std::uintptr_t* t = export_table(kCallbackHooks);
  for (const auto& [slot, count, bytes] : {std::tuple{2u, 1024u, 8192u}, {6u, 14u, 112u}}) {
    INFO("slot " << slot);
    void* buffer = nullptr;
    std::size_t size = 0;
    void* returned = slot_fn<GetBufferFn>(t, slot)(&buffer, &size);
    CHECK(size == count);
    CHECK(returned == buffer);
    REQUIRE(buffer != nullptr);
    const auto* b = static_cast<const std::uint8_t*>(buffer);
    CHECK(std::all_of(b, b + bytes, [](std::uint8_t x) { return x == 0; }));
    void* again = nullptr;
    slot_fn<GetBufferFn>(t, slot)(&again, &size);
    CHECK(again == buffer);
  }
  for (const std::size_t slot : {1u, 3u, 4u, 5u}) {
    CHECK(slot_fn<CUresult (*)()>(t, slot)() == CUDA_SUCCESS);
  }
}

TEST_CASE("TOOLS_TLS slot 2: the calling thread's current context", "[export]") {
  reset_fake_core();
  const std::uintptr_t* t = export_table(kToolsTls);
  const auto get_current = slot_fn<CUresult (*)(CUcontext*, std::uintptr_t)>(t, 2);
  CUcontext ctx = fake_context(1);
  CHECK(get_current(&ctx, 0) == CUDA_SUCCESS);
  CHECK(ctx == nullptr);
  set_current_context(fake_context(5));
  CHECK(get_current(&ctx, 0x37) == CUDA_SUCCESS);
  CHECK(ctx == fake_context(5));
  CHECK(get_current(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(slot_fn<CUresult (*)()>(t, 1)() == CUDA_SUCCESS);
}

TEST_CASE("CONTEXT_CHECKS slots 2 and 3", "[export]") {
  reset_fake_core();
  const std::uintptr_t* t = export_table(kContextChecks);
  const auto check = slot_fn<CUresult (*)(CUcontext, std::uint32_t*, void**)>(t, 2);
  std::uint32_t out1 = 7;
  void* out2 = &out1;
  CHECK(check(nullptr, &out1, &out2) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(out1 == 7);
  set_current_context(fake_context(5));
  CHECK(check(nullptr, &out1, &out2) == CUDA_SUCCESS);
  CHECK(out1 == 0);
  CHECK(out2 == &out1);  // never written
  out1 = 7;
  CHECK(check(fake_context(5), &out1, &out2) == CUDA_SUCCESS);
  CHECK(out1 == 0);
  CHECK(slot_fn<std::uint32_t (*)(void*)>(t, 3)(&out1) == 0);
}

TEST_CASE("TOOLS_CONTEXT slots 3 and 4: device ordinal and unique id", "[export]") {
  FakeCore& core = reset_fake_core();
  core.contexts[fake_context(1)] = {0, 1};
  core.contexts[fake_context(2)] = {1, 2};
  const std::uintptr_t* t = export_table(kToolsContext);
  const auto get_device = slot_fn<CUresult (*)(CUcontext, std::int32_t*)>(t, 3);
  const auto get_id = slot_fn<CUresult (*)(CUcontext, std::uint64_t*)>(t, 4);

  std::int32_t device = -1;
  CHECK(get_device(fake_context(2), &device) == CUDA_SUCCESS);
  CHECK(device == 1);
  device = -1;
  set_current_context(fake_context(1));  // NULL does not mean current here
  CHECK(get_device(nullptr, &device) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(device == -1);
  CHECK(get_device(fake_context(3), &device) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(device == -1);

  std::uint64_t id = 99;
  CHECK(get_id(fake_context(1), &id) == CUDA_SUCCESS);
  CHECK(id == 1);
  CHECK(get_id(fake_context(2), &id) == CUDA_SUCCESS);
  CHECK(id == 2);
  CHECK(get_id(nullptr, &id) == CUDA_SUCCESS);
  CHECK(id == 0);
  id = 99;
  CHECK(get_id(fake_context(3), &id) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(id == 99);
}

TEST_CASE("TOOLS_MODULE slot 7: walks a module's functions in order", "[export]") {
  FakeCore& core = reset_fake_core();
  const auto f = [](std::uintptr_t n) { return reinterpret_cast<CUfunction>(n << 4); };
  core.module_functions = {
      {f(1), "_Z10vector_fftILj4096E"}, {f(2), "store_value"}, {f(3), "empty"}};
  struct Seen {
    std::vector<CUfunction> functions;
    std::vector<std::string> names;
  } seen;
  using Visit = void (*)(void*, CUfunction, const char*);
  const auto walk =
      slot_fn<std::size_t (*)(CUcontext, CUmodule, Visit, void*)>(export_table(kToolsModule), 7);
  const Visit visit = [](void* user, CUfunction function, const char* name) {
    auto* s = static_cast<Seen*>(user);
    s->functions.push_back(function);
    s->names.emplace_back(name);
  };
  // The context is not used: the real slot walks the same with NULL or another context.
  CHECK(walk(nullptr, fake_module(), visit, &seen) == 3);
  CHECK(seen.functions == std::vector<CUfunction>{f(1), f(2), f(3)});
  CHECK(seen.names == std::vector<std::string>{"_Z10vector_fftILj4096E", "store_value", "empty"});
  // A module the driver does not know walks nothing.
  seen = {};
  CHECK(walk(fake_context(1), reinterpret_cast<CUmodule>(std::uintptr_t{0x3000}), visit, &seen) ==
        0);
  CHECK(seen.functions.empty());
  // Other slots stay traps.
  using TrapFn = CUresult (*)();
  CHECK(slot_fn<TrapFn>(export_table(kToolsModule), 6)() == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(slot_fn<TrapFn>(export_table(kToolsModule), 98)() == CUDA_ERROR_NOT_SUPPORTED);
}

TEST_CASE("INTEGRITY_CHECK slot 1 hashes what the application sees", "[export]") {
  FakeCore& core = reset_fake_core();
  core.driver_version = 13000;
  core.devices.resize(2);
  const std::array<std::array<std::uint8_t, 16>, 2> uuids{{
      {0x04, 0xc9, 0xf6, 0x28, 0x63, 0x12, 0xff, 0x63, 0xa8, 0x10, 0xd3, 0x2f, 0x42, 0xf0, 0xd4,
       0xbf},
      {0x18, 0x2d, 0xd7, 0x96, 0x46, 0x2b, 0xb2, 0x96, 0xa9, 0xbc, 0x56, 0xe2, 0xcb, 0xd7, 0xd9,
       0xbd},
  }};
  for (std::size_t i = 0; i < 2; ++i) {
    std::memcpy(core.devices[i].uuid, uuids[i].data(), 16);
    core.devices[i].attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID] = static_cast<int>(i);
    core.devices[i].attributes[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID] = 0x41;
    core.devices[i].attributes[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID] = 6 + static_cast<int>(i);
  }

  const std::uintptr_t* t = export_table(kIntegrityCheck);
  using CheckFn = CUresult (*)(std::uint32_t, std::uint64_t, std::uint64_t*);
  const auto check = slot_fn<CheckFn>(t, 1);

  const std::vector<mpsshim::shim::IntegrityDevice> devices{
      {uuids[0], 0, 0x41, 6},
      {uuids[1], 1, 0x41, 7},
  };
  const mpsshim::shim::IntegrityInputs expected_inputs{
      13000,
      static_cast<std::uint32_t>(getpid()),
      static_cast<std::uint32_t>(static_cast<std::uintptr_t>(pthread_self())),
      reinterpret_cast<std::uintptr_t>(export_table(kCudartInterface)),
      reinterpret_cast<std::uintptr_t>(t),
      t[1],
      devices,
  };
  constexpr std::uint64_t kSeconds = 1795253071;
  for (const std::uint32_t version : {13000u, 13001u, 13002u, 12082u, 7u}) {
    INFO("version " << version);
    std::uint64_t result[2] = {};
    REQUIRE(check(version, kSeconds, result) == CUDA_SUCCESS);
    const auto expected = mpsshim::shim::integrity_digest(expected_inputs, version, kSeconds);
    CHECK(std::memcmp(result, expected.data(), 16) == 0);
  }
  CHECK(check(13002, kSeconds, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(slot_fn<CUresult (*)(int)>(t, 2)(1) == CUDA_SUCCESS);
}

// CONTEXT_LOCAL_STORAGE semantics as measured on the real driver (docs/private-tables.md,
// "CONTEXT_LOCAL_STORAGE"), driven through the table cuGetExportTable returns.
#include <catch2/catch.hpp>

#include <tuple>
#include <vector>

#include "libshim/client_view.hpp"
#include "tests/darkapi/fake_core.hpp"
#include "tests/darkapi/tables.hpp"

using namespace mpsshim::test;

namespace {

using Dtor = void (*)(CUcontext, void*, void*);
using PutFn = CUresult (*)(CUcontext, void*, void*, Dtor);
using DeleteFn = CUresult (*)(CUcontext, void*);
using GetFn = CUresult (*)(void**, CUcontext, void*);

struct Cls {
  PutFn put;
  DeleteFn del;
  GetFn get;
};

Cls cls() {
  const std::uintptr_t* t = export_table(kContextLocalStorage);
  return Cls{slot_fn<PutFn>(t, 0), slot_fn<DeleteFn>(t, 1), slot_fn<GetFn>(t, 2)};
}

std::vector<std::tuple<CUcontext, void*, void*>> dtor_calls;
void record_dtor(CUcontext ctx, void* key, void* value) {
  dtor_calls.emplace_back(ctx, key, value);
}

void* ptr(std::uintptr_t n) {
  return reinterpret_cast<void*>(n);
}

}  // namespace

TEST_CASE("CLS: NULL context without a current one is 201 and writes nothing", "[cls]") {
  reset_fake_core();
  const Cls c = cls();
  CHECK(c.put(nullptr, ptr(1), ptr(2), nullptr) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(c.del(nullptr, ptr(1)) == CUDA_ERROR_INVALID_CONTEXT);
  void* out = ptr(0x77);
  CHECK(c.get(&out, nullptr, ptr(1)) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(out == ptr(0x77));
}

TEST_CASE("CLS: put, duplicate put, get, delete", "[cls]") {
  reset_fake_core();
  dtor_calls.clear();
  const Cls c = cls();
  const CUcontext ctx = fake_context(101);
  void* out = ptr(0x77);

  CHECK(c.get(&out, ctx, ptr(1)) == CUDA_ERROR_INVALID_HANDLE);  // missing: 400, untouched
  CHECK(out == ptr(0x77));

  REQUIRE(c.put(ctx, ptr(1), ptr(10), &record_dtor) == CUDA_SUCCESS);
  CHECK(c.put(ctx, ptr(1), ptr(11), nullptr) == CUDA_ERROR_INVALID_HANDLE);  // old value kept
  CHECK(c.get(&out, ctx, ptr(1)) == CUDA_SUCCESS);
  CHECK(out == ptr(10));

  // NULL value and NULL destructor are accepted.
  REQUIRE(c.put(ctx, ptr(2), nullptr, nullptr) == CUDA_SUCCESS);
  CHECK(c.get(&out, ctx, ptr(2)) == CUDA_SUCCESS);
  CHECK(out == nullptr);

  // Delete does not run the destructor; deleting again is 400.
  CHECK(c.del(ctx, ptr(1)) == CUDA_SUCCESS);
  CHECK(dtor_calls.empty());
  CHECK(c.del(ctx, ptr(1)) == CUDA_ERROR_INVALID_HANDLE);
  out = ptr(0x77);
  CHECK(c.get(&out, ctx, ptr(1)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(out == ptr(0x77));
  // And the key can be put again after a delete.
  CHECK(c.put(ctx, ptr(1), ptr(12), nullptr) == CUDA_SUCCESS);

  CHECK(c.get(nullptr, ctx, ptr(1)) == CUDA_ERROR_INVALID_VALUE);
  mpsshim::shim::run_context_local_destructors(ctx);
}

TEST_CASE("CLS: storage is per (context, key); NULL means the current context", "[cls]") {
  reset_fake_core();
  const Cls c = cls();
  const CUcontext a = fake_context(201);
  const CUcontext b = fake_context(202);
  set_current_context(a);
  REQUIRE(c.put(nullptr, ptr(1), ptr(10), nullptr) == CUDA_SUCCESS);
  REQUIRE(c.put(b, ptr(1), ptr(20), nullptr) == CUDA_SUCCESS);

  void* out = nullptr;
  CHECK(c.get(&out, a, ptr(1)) == CUDA_SUCCESS);
  CHECK(out == ptr(10));
  CHECK(c.get(&out, nullptr, ptr(1)) == CUDA_SUCCESS);
  CHECK(out == ptr(10));
  CHECK(c.get(&out, b, ptr(1)) == CUDA_SUCCESS);
  CHECK(out == ptr(20));
  set_current_context(b);
  CHECK(c.get(&out, nullptr, ptr(1)) == CUDA_SUCCESS);
  CHECK(out == ptr(20));
  CHECK(c.del(nullptr, ptr(1)) == CUDA_SUCCESS);
  CHECK(c.get(&out, a, ptr(1)) == CUDA_SUCCESS);  // a's entry untouched
  CHECK(out == ptr(10));

  mpsshim::shim::run_context_local_destructors(a);
  mpsshim::shim::run_context_local_destructors(b);
}

TEST_CASE("CLS: destructors run once per entry, then the storage is empty", "[cls]") {
  reset_fake_core();
  dtor_calls.clear();
  const Cls c = cls();
  const CUcontext ctx = fake_context(301);
  const CUcontext other = fake_context(302);
  REQUIRE(c.put(ctx, ptr(1), ptr(10), &record_dtor) == CUDA_SUCCESS);
  REQUIRE(c.put(ctx, ptr(2), ptr(20), nullptr) == CUDA_SUCCESS);
  REQUIRE(c.put(ctx, ptr(3), nullptr, &record_dtor) == CUDA_SUCCESS);
  REQUIRE(c.put(other, ptr(1), ptr(99), &record_dtor) == CUDA_SUCCESS);

  mpsshim::shim::run_context_local_destructors(ctx);
  REQUIRE(dtor_calls.size() == 2);
  CHECK(dtor_calls[0] == std::make_tuple(ctx, ptr(1), ptr(10)));
  CHECK(dtor_calls[1] == std::make_tuple(ctx, ptr(3), nullptr));

  void* out = ptr(0x77);
  for (const std::uintptr_t key : {1, 2, 3}) {
    CHECK(c.get(&out, ctx, ptr(key)) == CUDA_ERROR_INVALID_HANDLE);
  }
  CHECK(out == ptr(0x77));
  mpsshim::shim::run_context_local_destructors(ctx);  // nothing left: no second call
  CHECK(dtor_calls.size() == 2);

  CHECK(c.get(&out, other, ptr(1)) == CUDA_SUCCESS);  // other contexts keep theirs
  CHECK(out == ptr(99));
  mpsshim::shim::run_context_local_destructors(other);
  CHECK(dtor_calls.size() == 3);
  mpsshim::shim::run_context_local_destructors(nullptr);  // harmless
}

namespace {

// A destructor that uses the table again, as a runtime tearing down its state might.
void reentrant_dtor(CUcontext ctx, void* key, void*) {
  void* out = nullptr;
  dtor_calls.emplace_back(ctx, key, ptr(cls().get(&out, ctx, key)));
  cls().put(ctx, ptr(0x99), nullptr, nullptr);
}

}  // namespace

TEST_CASE("CLS: destructors may call back into the table", "[cls]") {
  reset_fake_core();
  dtor_calls.clear();
  const CUcontext ctx = fake_context(401);
  REQUIRE(cls().put(ctx, ptr(1), ptr(10), &reentrant_dtor) == CUDA_SUCCESS);
  mpsshim::shim::run_context_local_destructors(ctx);  // must not deadlock
  REQUIRE(dtor_calls.size() == 1);
  // The entry was already gone when its destructor ran.
  CHECK(std::get<2>(dtor_calls[0]) == ptr(CUDA_ERROR_INVALID_HANDLE));
  mpsshim::shim::run_context_local_destructors(ctx);
}

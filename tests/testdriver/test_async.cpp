// Host functions run in stream order; pool memory is valid at once, returned in stream order,
// and accounted in its own pool.
#include <atomic>
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

using namespace std::chrono_literals;

struct Seen {
  std::atomic<int> calls{0};
  std::atomic<bool> release{false};
  CUstream stream = nullptr;
  CUresult status = CUDA_ERROR_UNKNOWN;
};

void CUDA_CB blocking_host_fn(void* data) {
  auto* seen = static_cast<Seen*>(data);
  while (!seen->release.load()) std::this_thread::sleep_for(1ms);
  ++seen->calls;
}

void CUDA_CB stream_callback(CUstream stream, CUresult status, void* data) {
  auto* seen = static_cast<Seen*>(data);
  seen->stream = stream;
  seen->status = status;
  ++seen->calls;
}

CUmemoryPool make_pool(Session& s, std::size_t max_size = 0) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, s.device};
  props.maxSize = max_size;
  CUmemoryPool pool = nullptr;
  REQUIRE_CU(s.sut.cuMemPoolCreate(&pool, &props));
  return pool;
}

std::uint64_t attribute(Session& s, CUmemoryPool pool, CUmemPool_attribute attr) {
  cuuint64_t value = 0;
  REQUIRE_CU(s.sut.cuMemPoolGetAttribute(pool, attr, &value));
  return value;
}

TEST_CASE("work after a host function waits until it returns", "[async]") {
  Session sut;
  Seen seen;
  const CUevent after = sut.event(CU_EVENT_DISABLE_TIMING);

  REQUIRE_CU(sut.sut.cuLaunchHostFunc(sut.stream, blocking_host_fn, &seen));
  REQUIRE_CU(sut.sut.cuEventRecordWithFlags(after, sut.stream, 0));
  std::this_thread::sleep_for(50ms);
  CHECK_CU(sut.sut.cuEventQuery(after), CUDA_ERROR_NOT_READY);

  seen.release = true;
  REQUIRE_CU(sut.sut.cuStreamSynchronize(sut.stream));
  CHECK(seen.calls == 1);
  CHECK_CU(sut.sut.cuEventQuery(after), CUDA_SUCCESS);
}

TEST_CASE("a stream callback gets its stream and status; flags must be 0", "[async]") {
  Session sut;
  Seen seen;

  CHECK_CU(sut.sut.cuStreamAddCallback(sut.stream, stream_callback, &seen, 1),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(sut.sut.cuStreamAddCallback(sut.stream, stream_callback, &seen, 0));
  REQUIRE_CU(sut.sut.cuStreamSynchronize(sut.stream));

  CHECK(seen.calls == 1);
  CHECK(seen.stream == sut.stream);
  CHECK(seen.status == CUDA_SUCCESS);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  REQUIRE_CU(sut.sut.cuStreamIsCapturing(sut.stream, &capture));
  CHECK(capture == CU_STREAM_CAPTURE_STATUS_NONE);
}

TEST_CASE("pool memory is usable at once and freed in stream order", "[async]") {
  Session sut;
  const int before = driver().live_objects();
  CUmemoryPool pool = make_pool(sut);
  Seen seen;
  CUdeviceptr p = 0;

  REQUIRE_CU(sut.sut.cuMemAllocFromPoolAsync(&p, 4096, pool, sut.stream));
  REQUIRE_CU(sut.sut.cuMemsetD32Async(p, 7, 1024, sut.stream));
  CHECK(attribute(sut, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 4096);
  REQUIRE_CU(sut.sut.cuLaunchHostFunc(sut.stream, blocking_host_fn, &seen));
  REQUIRE_CU(sut.sut.cuMemFreeAsync(p, sut.stream));
  std::this_thread::sleep_for(20ms);
  CHECK(attribute(sut, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 4096);  // not there yet

  seen.release = true;
  REQUIRE_CU(sut.sut.cuStreamSynchronize(sut.stream));
  CHECK(attribute(sut, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
  CHECK(attribute(sut, pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 4096);
  REQUIRE_CU(sut.sut.cuMemPoolDestroy(pool));
  CHECK(driver().live_objects() == before);
}

TEST_CASE("a pool keeps freed memory up to its release threshold and honours its max size",
          "[async]") {
  Session sut;
  CUmemoryPool pool = make_pool(sut, 1 << 20);
  cuuint64_t threshold = 1 << 20;
  REQUIRE_CU(sut.sut.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  CUdeviceptr p = 0, q = 0;

  REQUIRE_CU(sut.sut.cuMemAllocFromPoolAsync(&p, 512 << 10, pool, sut.stream));
  CHECK_CU(sut.sut.cuMemAllocFromPoolAsync(&q, 768 << 10, pool, sut.stream),
           CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE_CU(sut.sut.cuMemFreeAsync(p, sut.stream));
  REQUIRE_CU(sut.sut.cuStreamSynchronize(sut.stream));

  CHECK(attribute(sut, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 512 << 10);
  REQUIRE_CU(sut.sut.cuMemPoolTrimTo(pool, 0));
  CHECK(attribute(sut, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
  cuuint64_t nonzero = 1;
  CHECK_CU(sut.sut.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &nonzero),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(sut.sut.cuMemPoolDestroy(pool));
}

TEST_CASE("a destroyed pool lives until its last allocation is freed", "[async]") {
  Session sut;
  const int before = driver().live_objects();
  CUmemoryPool pool = make_pool(sut);
  CUdeviceptr p = 0;
  REQUIRE_CU(sut.sut.cuMemAllocFromPoolAsync(&p, 4096, pool, sut.stream));

  REQUIRE_CU(sut.sut.cuMemPoolDestroy(pool));
  CHECK(driver().live_objects() == before + 2);  // the pool and its allocation
  CUdeviceptr q = 0;
  CHECK_CU(sut.sut.cuMemAllocFromPoolAsync(&q, 4096, pool, sut.stream), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(sut.sut.cuMemFree_v2(p));  // cuMemFree takes pool memory too

  CHECK(driver().live_objects() == before);
}

TEST_CASE("exportable and host pools are refused", "[async]") {
  Session sut;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, sut.device};
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemoryPool pool = nullptr;

  CHECK_CU(sut.sut.cuMemPoolCreate(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location = {CU_MEM_LOCATION_TYPE_HOST, 0};
  CHECK_CU(sut.sut.cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

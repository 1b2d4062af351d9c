// Streams run asynchronously and in order; events capture and time stream positions.
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

using namespace std::chrono_literals;

constexpr int kSleepMicroseconds = 100000;  // long enough to observe work in flight

void launch_sleep(Session& s, CUstream stream, int microseconds) {
  CUfunction sleeper = s.function("sleep_kernel");
  void* args[] = {&microseconds};
  REQUIRE_CU(s.sut.cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr));
}

void launch_increment(Session& s, CUstream stream, CUdeviceptr p, int n) {
  CUfunction inc = s.function("increment_i32");
  void* args[] = {&p, &n};
  REQUIRE_CU(s.sut.cuLaunchKernel(inc, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
}

TEST_CASE("work runs after the call that enqueued it returns", "[streams]") {
  Session s;
  const CUevent done = s.event(CU_EVENT_DEFAULT);

  launch_sleep(s, s.stream, kSleepMicroseconds);
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(done, s.stream, 0));

  CHECK_CU(s.sut.cuStreamQuery(s.stream), CUDA_ERROR_NOT_READY);
  CHECK_CU(s.sut.cuEventQuery(done), CUDA_ERROR_NOT_READY);
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
  CHECK_CU(s.sut.cuStreamQuery(s.stream), CUDA_SUCCESS);
  CHECK_CU(s.sut.cuEventQuery(done), CUDA_SUCCESS);
}

TEST_CASE("events time the work between them", "[streams]") {
  Session s;
  const CUevent start = s.event(CU_EVENT_DEFAULT);
  const CUevent stop = s.event(CU_EVENT_BLOCKING_SYNC);
  const CUevent untimed = s.event(CU_EVENT_DISABLE_TIMING);
  CUevent unrecorded = s.event(CU_EVENT_DEFAULT);
  CHECK_CU(s.sut.cuEventQuery(unrecorded), CUDA_SUCCESS);  // an empty set of work

  REQUIRE_CU(s.sut.cuEventRecordWithFlags(start, s.stream, 0));
  launch_sleep(s, s.stream, kSleepMicroseconds);
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(stop, s.stream, 0));
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(untimed, s.stream, 0));
  float ms = 0;
  CHECK_CU(s.sut.cuEventElapsedTime_v2(&ms, start, stop), CUDA_ERROR_NOT_READY);
  s.sync();

  REQUIRE_CU(s.sut.cuEventElapsedTime_v2(&ms, start, stop));
  CHECK(ms >= 99.0f);
  CHECK(ms < 5000.0f);
  CHECK_CU(s.sut.cuEventElapsedTime_v2(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(s.sut.cuEventElapsedTime_v2(&ms, start, unrecorded), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(s.sut.cuEventRecordWithFlags(start, s.stream, CU_EVENT_RECORD_EXTERNAL),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuEventCreate(&unrecorded, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuEventDestroy_v2(start));
  CHECK_CU(s.sut.cuEventQuery(start), CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("an event of the primary context records on a green context's stream", "[streams]") {
  Session s;
  CUevent primary_event = nullptr;
  REQUIRE_CU(s.sut.cuEventCreate(&primary_event, CU_EVENT_DEFAULT));  // the primary is current
  // As an H200's driver does (tools/probes/green_nested.cu).
  CHECK_CU(s.sut.cuEventRecordWithFlags(primary_event, s.stream, 0), CUDA_SUCCESS);
  CHECK_CU(s.sut.cuEventRecordWithFlags(primary_event, nullptr, 0), CUDA_SUCCESS);
  // Waiting crosses contexts freely.
  CHECK_CU(s.sut.cuStreamWaitEvent(s.stream, primary_event, 0), CUDA_SUCCESS);
  s.sync();
}

TEST_CASE("NULL names the green context's default stream while it is current", "[streams]") {
  Session s;
  REQUIRE_CU(s.sut.cuCtxSetCurrent(s.green_ctx));
  const CUdeviceptr p = s.alloc(sizeof(int));
  CUevent e = nullptr;
  REQUIRE_CU(s.sut.cuEventCreate(&e, CU_EVENT_DEFAULT));
  REQUIRE_CU(s.sut.cuMemsetD32Async(p, 9, 1, nullptr));
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(e, nullptr, 0));
  REQUIRE_CU(s.sut.cuStreamSynchronize(nullptr));
  CHECK_CU(s.sut.cuEventQuery(e), CUDA_SUCCESS);
  REQUIRE_CU(s.sut.cuCtxSetCurrent(s.ctx));
  CHECK(s.download<int>(p, 1)[0] == 9);
}

TEST_CASE("a stream waits for an event recorded in another", "[streams]") {
  Session s;
  const GreenStream other = make_green_stream(0, 8, 2, 0);
  const CUdeviceptr counter = s.alloc(sizeof(int));
  REQUIRE_CU(s.sut.cuMemsetD32Async(counter, 0, 1, s.stream));
  s.sync();
  int pinned = -1;
  REQUIRE_CU(s.sut.cuMemHostRegister_v2(&pinned, sizeof pinned, 0));
  const CUevent incremented = s.event(CU_EVENT_DISABLE_TIMING);

  launch_sleep(s, s.stream, kSleepMicroseconds);
  launch_increment(s, s.stream, counter, 1);
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(incremented, s.stream, 0));
  REQUIRE_CU(s.sut.cuStreamWaitEvent(other.stream, incremented, 0));
  REQUIRE_CU(s.sut.cuMemcpyDtoHAsync_v2(&pinned, counter, sizeof pinned, other.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(other.stream));

  CHECK(pinned == 1);
  REQUIRE_CU(s.sut.cuMemHostUnregister(&pinned));
  destroy_green_stream(other);
}

TEST_CASE("copies to pinned memory are asynchronous, to pageable memory synchronous", "[streams]") {
  Session s;
  const CUdeviceptr value = s.alloc(sizeof(int));
  REQUIRE_CU(s.sut.cuMemsetD32Async(value, 7, 1, s.stream));
  int pinned = 0;
  REQUIRE_CU(s.sut.cuMemHostRegister_v2(&pinned, sizeof pinned, 0));

  launch_sleep(s, s.stream, kSleepMicroseconds);
  REQUIRE_CU(s.sut.cuMemcpyDtoHAsync_v2(&pinned, value, sizeof pinned, s.stream));
  CHECK(reinterpret_cast<volatile int&>(pinned) == 0);  // still behind the sleeping kernel
  int pageable = 0;
  REQUIRE_CU(s.sut.cuMemcpyDtoHAsync_v2(&pageable, value, sizeof pageable, s.stream));
  CHECK(pageable == 7);  // returned only once the copy had run
  CHECK(pinned == 7);    // which was after the one before it
  REQUIRE_CU(s.sut.cuMemHostUnregister(&pinned));
}

TEST_CASE("a destroyed stream still runs what it was given", "[streams]") {
  Session s;
  const GreenStream doomed = make_green_stream(0, 8, 1, 0);
  const CUdeviceptr value = s.alloc(sizeof(int));
  REQUIRE_CU(s.sut.cuMemsetD32Async(value, 5, 1, s.stream));
  s.sync();
  int pinned = 0;
  REQUIRE_CU(s.sut.cuMemHostRegister_v2(&pinned, sizeof pinned, 0));

  const CUevent copied = make_event(doomed.green, CU_EVENT_DISABLE_TIMING, s.ctx);

  launch_sleep(s, doomed.stream, kSleepMicroseconds / 2);
  REQUIRE_CU(s.sut.cuMemcpyDtoHAsync_v2(&pinned, value, sizeof pinned, doomed.stream));
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(copied, doomed.stream, 0));
  REQUIRE_CU(s.sut.cuStreamDestroy_v2(doomed.stream));
  CHECK_CU(s.sut.cuStreamQuery(doomed.stream), CUDA_ERROR_INVALID_HANDLE);

  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (s.sut.cuEventQuery(copied) == CUDA_ERROR_NOT_READY &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  CHECK_CU(s.sut.cuEventQuery(copied), CUDA_SUCCESS);
  CHECK(pinned == 5);
  REQUIRE_CU(s.sut.cuGreenCtxDestroy(doomed.green));
  REQUIRE_CU(s.sut.cuMemHostUnregister(&pinned));
}

TEST_CASE("streams outlive their green context only to report it destroyed", "[streams]") {
  Session s;
  const int live_before = driver().live_objects();
  const GreenStream g = make_green_stream(0, 8, 1, 0);
  CHECK(driver().live_objects() == live_before + 2);

  REQUIRE_CU(s.sut.cuGreenCtxDestroy(g.green));
  CHECK(driver().live_objects() == live_before + 1);  // the stream leaks until destroyed
  CHECK_CU(s.sut.cuStreamQuery(g.stream), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_CU(s.sut.cuStreamDestroy_v2(g.stream), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_CU(s.sut.cuGreenCtxDestroy(g.green), CUDA_ERROR_INVALID_CONTEXT);
}

}  // namespace
}  // namespace mpsshim::testdriver::test

// cuCtxRecordEvent and cuCtxWaitEvent on the current context: the context's event completes only
// after a slow kernel on one of its streams, while another stream's later work does not wait for
// it; after cuCtxWaitEvent, another stream and the legacy stream see a value written before the
// event; a context event while a stream captures is refused. Result fields equal natively and
// under mpsshim.
static const char* const kProgram = "rt_ctx_events";
#include <cuda.h>

#include "rt_driver.cuh"

__global__ void slow_set(int* p, int value, unsigned long long nanoseconds) {
  rt_spin_ns(nanoseconds);
  *p = value;
}

__global__ void copy_one(const int* from, int* to) {
  *to = *from;
}

int main() {
  RT_CHECK(cudaFree(nullptr));
  CUcontext ctx{};
  CU_CHECK(cuCtxGetCurrent(&ctx));
  cudaStream_t a{}, b{};
  RT_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  int *p = nullptr, *q = nullptr;
  RT_CHECK(cudaMalloc(&p, sizeof(int)));
  RT_CHECK(cudaMalloc(&q, 2 * sizeof(int)));
  // Both kernels run once first: a kernel's first launch loads it, which may wait for the
  // context's other work (lazy loading) and would hide what the events do.
  slow_set<<<1, 1, 0, a>>>(p, 0, 0);
  copy_one<<<1, 1, 0, b>>>(p, q);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemset(p, 0, sizeof(int)));
  RT_CHECK(cudaMemset(q, 0, 2 * sizeof(int)));
  RT_CHECK(cudaDeviceSynchronize());
  CUevent all{}, one{};
  CU_CHECK(cuEventCreate(&all, CU_EVENT_DISABLE_TIMING));
  CU_CHECK(cuEventCreate(&one, CU_EVENT_DISABLE_TIMING));

  slow_set<<<1, 1, 0, a>>>(p, 7, 500000000ull);  // half a second
  RT_CHECK_LAUNCH();
  CU_CHECK(cuCtxRecordEvent(ctx, all));
  copy_one<<<1, 1, 0, b>>>(p, q);  // does not wait for stream a
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaStreamSynchronize(b));
  const int running = static_cast<int>(cuEventQuery(all));
  CU_CHECK(cuEventSynchronize(all));
  int after_record = 0;
  RT_CHECK(cudaMemcpy(&after_record, p, sizeof(int), cudaMemcpyDeviceToHost));

  slow_set<<<1, 1, 0, a>>>(p, 9, 200000000ull);
  RT_CHECK_LAUNCH();
  CU_CHECK(cuEventRecord(one, reinterpret_cast<CUstream>(a)));
  CU_CHECK(cuCtxWaitEvent(ctx, one));
  copy_one<<<1, 1, 0, b>>>(p, q);
  copy_one<<<1, 1>>>(p, q + 1);  // the legacy stream
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaDeviceSynchronize());
  int seen[2] = {};
  RT_CHECK(cudaMemcpy(seen, q, sizeof seen, cudaMemcpyDeviceToHost));

  RT_CHECK(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed));
  const int in_capture = static_cast<int>(cuCtxRecordEvent(ctx, all));
  cudaGraph_t graph{};
  const int end_capture = static_cast<int>(cudaStreamEndCapture(b, &graph));
  (void)cudaGetLastError();
  if (graph != nullptr) RT_CHECK(cudaGraphDestroy(graph));

  CU_CHECK(cuEventDestroy(all));
  CU_CHECK(cuEventDestroy(one));
  RT_CHECK(cudaFree(p));
  RT_CHECK(cudaFree(q));
  const bool ok =
      running == CUDA_ERROR_NOT_READY && after_record == 7 && seen[0] == 9 && seen[1] == 9;
  return RT_REPORT(ok,
                   "running=%d after_record=%d stream_saw=%d legacy_saw=%d in_capture=%d "
                   "end_capture=%d",
                   running, after_record, seen[0], seen[1], in_capture, end_capture);
}

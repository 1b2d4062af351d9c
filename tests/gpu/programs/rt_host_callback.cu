// cudaLaunchHostFunc between two kernels proves stream order both ways: the callback reads what
// the first kernel produced (copied to pinned memory before it), and the second kernel's input
// is what the callback wrote into pinned memory (copied to the device after it). More callbacks
// on a second stream count how many ran, and in which order.
static const char* const kProgram = "rt_host_callback";
#include <atomic>
#include <vector>

#include "rt_common.cuh"

constexpr int kN = 1 << 16;
constexpr int kCounted = 50;

__global__ void produce(int* p, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) rt_spin_ns(20ull * 1000 * 1000);  // a late producer
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = 3 * i + 5;
}

__global__ void consume(const int* in, int* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i] * 2 - 1;
}

struct Handoff {
  const int* produced;  // pinned: the first kernel's output
  int* written;         // pinned: the second kernel's input
  long long sum = 0;
  int stale = 0;
};

void CUDART_CB between(void* data) {
  auto* h = static_cast<Handoff*>(data);
  for (int i = 0; i < kN; ++i) {
    h->stale += h->produced[i] != 3 * i + 5;
    h->sum += h->produced[i];
  }
  for (int i = 0; i < kN; ++i) h->written[i] = h->produced[i] + static_cast<int>(h->sum % 1000);
}

struct Counter {
  std::atomic<int> calls{0};
  std::atomic<int> out_of_order{0};
};
struct Tick {
  Counter* counter;
  int index;
};

void CUDART_CB count(void* data) {
  auto* t = static_cast<Tick*>(data);
  const int before = t->counter->calls.fetch_add(1);
  if (before != t->index) t->counter->out_of_order.fetch_add(1);
}

int main() {
  const size_t bytes = sizeof(int) * kN;
  int *produced, *written, *result;
  RT_CHECK(cudaMallocHost(&produced, bytes));
  RT_CHECK(cudaMallocHost(&written, bytes));
  RT_CHECK(cudaMallocHost(&result, bytes));
  for (int i = 0; i < kN; ++i) produced[i] = written[i] = result[i] = -1;
  int *d_a, *d_b, *d_c, *d_scratch;
  RT_CHECK(cudaMalloc(&d_scratch, bytes));
  RT_CHECK(cudaMemset(d_scratch, 0, bytes));
  RT_CHECK(cudaMalloc(&d_a, bytes));
  RT_CHECK(cudaMalloc(&d_b, bytes));
  RT_CHECK(cudaMalloc(&d_c, bytes));
  cudaStream_t stream, other;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));

  Handoff handoff{produced, written};
  produce<<<64, 256, 0, stream>>>(d_a, kN);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpyAsync(produced, d_a, bytes, cudaMemcpyDeviceToHost, stream));
  RT_CHECK(cudaLaunchHostFunc(stream, between, &handoff));
  RT_CHECK(cudaMemcpyAsync(d_b, written, bytes, cudaMemcpyHostToDevice, stream));
  consume<<<64, 256, 0, stream>>>(d_b, d_c, kN);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpyAsync(result, d_c, bytes, cudaMemcpyDeviceToHost, stream));

  Counter counter;
  std::vector<Tick> ticks(kCounted);
  for (int i = 0; i < kCounted; ++i) {
    ticks[i] = {&counter, i};
    if (i % 10 == 0) consume<<<16, 256, 0, other>>>(d_scratch, d_scratch, kN);  // interleaved work
    RT_CHECK(cudaLaunchHostFunc(other, count, &ticks[i]));
  }
  RT_CHECK(cudaStreamSynchronize(stream));
  RT_CHECK(cudaStreamSynchronize(other));

  long long expect_sum = 0;
  for (int i = 0; i < kN; ++i) expect_sum += 3 * i + 5;
  int wrong = 0;
  for (int i = 0; i < kN; ++i)
    wrong += result[i] != (3 * i + 5 + static_cast<int>(expect_sum % 1000)) * 2 - 1;
  const bool ok = handoff.stale == 0 && handoff.sum == expect_sum && wrong == 0 &&
                  counter.calls == kCounted && counter.out_of_order == 0;
  const std::uint64_t checksum = rt_checksum(result, bytes);
  for (int* p : {d_a, d_b, d_c, d_scratch}) RT_CHECK(cudaFree(p));
  for (int* p : {produced, written, result}) RT_CHECK(cudaFreeHost(p));
  RT_CHECK(cudaStreamDestroy(stream));
  RT_CHECK(cudaStreamDestroy(other));
  return RT_REPORT(ok, "stale=%d sum=%lld wrong=%d callbacks=%d out_of_order=%d checksum=%016llx",
                   handoff.stale, handoff.sum, wrong, counter.calls.load(),
                   counter.out_of_order.load(), static_cast<unsigned long long>(checksum));
}

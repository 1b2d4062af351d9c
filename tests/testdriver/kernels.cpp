#include "tests/testdriver/kernels.hpp"

#include "tests/testdriver/texture.hpp"

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

namespace mpsshim::testdriver {
namespace {

// ---- Host bodies, one per kernel of examples/kernels/*.cu; each comment is the device code the
// ---- body models. Device code spells its multiply-adds as fmaf; the bodies use std::fma to get
// ---- the same bits.

// for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
//   c[i] = a[i] + b[i];
void vector_add(const KernelContext& k, const float* a, const float* b, float* c, int n) {
  const std::size_t count = KernelContext::elements(n);
  const float* ha = k.device(a, count);
  const float* hb = k.device(b, count);
  float* hc = k.device(c, count);
  for (std::size_t i = 0; i < count; ++i) hc[i] = ha[i] + hb[i];
}

// One 16x16 output tile per block (launched with blockDim (16, 16)), k staged through shared
// memory in tiles and accumulated in k order with fmaf:
// row = blockIdx.y * 16 + threadIdx.y; col = blockIdx.x * 16 + threadIdx.x;
// if (row < M && col < N) C[row * N + col] = sum over k of A[row * K + k] * B[k * N + col];
void matmul_tiled(const KernelContext& k, const float* A, const float* B, float* C, int M, int N,
                  int K) {
  if (M <= 0 || N <= 0) return;
  const std::size_t rows = std::min<std::uint64_t>(std::uint64_t{k.grid.y} * k.block.y, M);
  const std::size_t cols = std::min<std::uint64_t>(std::uint64_t{k.grid.x} * k.block.x, N);
  if (rows == 0 || cols == 0) return;
  const std::size_t n = static_cast<std::size_t>(N);
  const std::size_t depth = KernelContext::elements(K);
  const float* ha = k.device(A, rows * depth);
  const float* hb = k.device(B, depth == 0 ? 0 : (depth - 1) * n + cols);
  float* hc = k.device(C, (rows - 1) * n + cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      float sum = 0.0f;
      for (std::size_t i = 0; i < depth; ++i) sum = std::fma(ha[r * depth + i], hb[i * n + c], sum);
      hc[r * n + c] = sum;
    }
  }
}

// grid-stride over [0, n): y[i] = fmaf(alpha, x[i], y[i]);
void scale_add(const KernelContext& k, float* y, const float* x, float alpha, int n) {
  const std::size_t count = KernelContext::elements(n);
  float* hy = k.device(y, count);
  const float* hx = k.device(x, count);
  for (std::size_t i = 0; i < count; ++i) hy[i] = std::fma(alpha, hx[i], hy[i]);
}

// grid-stride over [0, n): p[i] = value;
void fill_u32(const KernelContext& k, unsigned int* p, unsigned int value, int n) {
  const std::size_t count = KernelContext::elements(n);
  unsigned int* hp = k.device(p, count);
  for (std::size_t i = 0; i < count; ++i) hp[i] = value;
}

// grid-stride over [0, n): p[i] += 1;
void increment_i32(const KernelContext& k, int* p, int n) {
  const std::size_t count = KernelContext::elements(n);
  int* hp = k.device(p, count);
  for (std::size_t i = 0; i < count; ++i) hp[i] += 1;
}

// One thread: *counter -= 1; cudaGraphSetConditional(handle, *counter > 0);
void countdown(const KernelContext& k, unsigned long long handle, int* counter) {
  int* c = k.device(counter, 1);
  *c -= 1;
  if (!set_graph_conditional(handle, *c > 0 ? 1u : 0u)) {
    throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
  }
}

// {}
void empty_kernel(const KernelContext&) {}

// start = %globaltimer; while (%globaltimer - start < nanoseconds) {}
// Per launch, not per block: the blocks spin concurrently on the device.
void spin_kernel(const KernelContext&, long long nanoseconds) {
  if (nanoseconds <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(nanoseconds);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// spin_kernel, then stamps[2 * index] = start, stamps[2 * index + 1] = end (%globaltimer; here
// the steady clock's nanoseconds).
void spin_stamp_kernel(const KernelContext& k, long long nanoseconds, unsigned long long* stamps,
                       int index) {
  auto now_ns = [] {
    return static_cast<unsigned long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now().time_since_epoch())
                                               .count());
  };
  const unsigned long long start = now_ns();
  spin_kernel(k, nanoseconds);
  unsigned long long* slot = k.device(stamps + 2 * static_cast<std::ptrdiff_t>(index), 2);
  slot[0] = start;
  slot[1] = now_ns();
}

// __nanosleep in a loop until `microseconds` have passed on %globaltimer; per launch too.
void sleep_kernel(const KernelContext&, int microseconds) {
  if (microseconds > 0) std::this_thread::sleep_for(std::chrono::microseconds(microseconds));
}

// if (threadIdx.x == 0) out[blockIdx.x] = %smid;
// Block x lands on the x-th SM (cyclically) of the stream's context, so a green context's quota
// is visible as the number of distinct ids.
void record_smid(const KernelContext& k, unsigned int* out) {
  unsigned int* hout = k.device(out, k.grid.x);
  for (std::size_t b = 0; b < k.grid.x; ++b) hout[b] = k.sms[b % k.sms.size()];
}

// if (threadIdx.x == 0) *(volatile int*)p = 0x0badf00d;  -- the host passes an address that is
// not device memory (NULL by default), which faults.
void trigger_fault(const KernelContext& k, int* p) {
  constexpr int kMarker = 0x0badf00d;
  *k.device(p, 1) = kMarker;
}

// One thread per texel (x, y) of a width x height grid:
// out[y * width + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f);
void tex2d_fetch_f32(const KernelContext& k, unsigned long long tex, float* out, int width,
                     int height) {
  if (width <= 0 || height <= 0) return;
  float* hout = k.device(out, static_cast<std::size_t>(width) * static_cast<std::size_t>(height));
  for (long y = 0; y < height; ++y)
    for (long x = 0; x < width; ++x) hout[y * width + x] = fetch_texel_f32(tex, x, y);
}

// ---- Table machinery: parameter layout and argument unpacking come from the body's signature, so
// ---- adding a kernel is one line in kTable.

constexpr std::size_t align_up(std::size_t v, std::size_t a) {
  return (v + a - 1) / a * a;
}

// The CUDA ABI lays parameters out in order, each at its natural alignment.
template <class... Args>
constexpr std::array<ParamInfo, sizeof...(Args)> layout() {
  std::array<ParamInfo, sizeof...(Args)> out{};
  [[maybe_unused]] std::size_t offset = 0;
  [[maybe_unused]] std::size_t i = 0;
  ((offset = align_up(offset, alignof(Args)), out[i++] = ParamInfo{offset, sizeof(Args)},
    offset += sizeof(Args)),
   ...);
  return out;
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <auto Body>
struct Entry;

template <class... Args, void (*Body)(const KernelContext&, Args...)>
struct Entry<Body> {
  static constexpr std::array<ParamInfo, sizeof...(Args)> params = layout<Args...>();

  static void run(const KernelContext& k, [[maybe_unused]] const std::byte* args) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      Body(k, load<Args>(args + params[I].offset)...);
    }
    (std::index_sequence_for<Args...>{});
  }

  static constexpr KernelDef def(std::string_view name) {
    const std::size_t size = params.empty() ? 0 : params.back().offset + params.back().size;
    return KernelDef{name, params, size, &run};
  }
};

constexpr std::array kTable{
    Entry<&vector_add>::def("vector_add"),
    Entry<&matmul_tiled>::def("matmul_tiled"),
    Entry<&scale_add>::def("scale_add"),
    Entry<&fill_u32>::def("fill_u32"),
    Entry<&increment_i32>::def("increment_i32"),
    Entry<&countdown>::def("countdown"),
    Entry<&empty_kernel>::def("empty_kernel"),
    Entry<&spin_kernel>::def("spin_kernel"),
    Entry<&spin_stamp_kernel>::def("spin_stamp_kernel"),
    // A launch runs once here, as one block: its end is its last block's.
    Entry<&spin_stamp_kernel>::def("spin_span_kernel"),
    Entry<&sleep_kernel>::def("sleep_kernel"),
    Entry<&record_smid>::def("record_smid"),
    Entry<&trigger_fault>::def("trigger_fault"),
    Entry<&tex2d_fetch_f32>::def("tex2d_fetch_f32"),
};

}  // namespace

std::span<const KernelDef> kernel_table() {
  return kTable;
}

const KernelDef* find_kernel(std::string_view name) {
  for (const KernelDef& k : kTable)
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace mpsshim::testdriver

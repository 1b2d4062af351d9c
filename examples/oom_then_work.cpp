// Runs out of device memory on purpose, then works. It allocates --chunk bytes (64M) at a time
// until cuMemAlloc refuses, then halves the chunk and goes on, down to --min-chunk (1M), so that
// it ends within --min-chunk of all it may hold (its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT under the
// shim, the device's free memory otherwise). Every refusal must be CUDA_ERROR_OUT_OF_MEMORY:
// another error (an invalid context, a fault, a lost server) fails the run. Each chunk gets a
// word of its own, read back before the frees, so that chunks handed out twice or overwritten
// show. Then it frees everything and runs vector_add on fresh buffers, checked exactly against
// the CPU: running out of memory must leave its context usable.
//
// The out-of-memory client of tests/gpu/soak.sh --pressure; it runs natively as well.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

constexpr unsigned kThreads = 256;
constexpr CUresult kExpectedRefusal = CUDA_ERROR_OUT_OF_MEMORY;

struct Chunk {
  CUdeviceptr address;
  std::size_t bytes;
};

// The word chunk `index` holds at its start.
unsigned chunk_word(std::size_t index) {
  return 0xA5000000u ^ static_cast<unsigned>(index);
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("oom_then_work");
  ex::Cli cli(argc, argv,
              "[--chunk BYTES (64M)] [--min-chunk BYTES (1M)] [--n ELEMENTS (1M)] "
              "[--device ORDINAL (0)]");
  const auto first_chunk =
      static_cast<std::size_t>(cli.integer("--chunk", 64 << 20, 1 << 20, 1LL << 40));
  const auto min_chunk =
      static_cast<std::size_t>(cli.integer("--min-chunk", 1 << 20, 4096, 1LL << 40));
  const auto n = static_cast<int>(cli.integer("--n", 1 << 20, 1, 1 << 26));
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();
  if (min_chunk > first_chunk) ex::fail_reason("min_chunk_over_chunk", __FILE__, __LINE__);

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction vector_add = ex::get_function(module, "vector_add");
  std::size_t device_bytes = 0;
  CU_CHECK(cuDeviceTotalMem(&device_bytes, device.device));

  // Out of memory: chunks of halving sizes until the smallest is refused too. More than the
  // device's whole memory without a refusal means the refusals are not happening at all.
  std::vector<Chunk> chunks;
  std::size_t held = 0, size = first_chunk;
  int refusals = 0;
  CUresult refusal = CUDA_SUCCESS;
  const auto start = ex::Clock::now();
  while (size >= min_chunk && held <= device_bytes) {
    CUdeviceptr address = 0;
    const CUresult result = cuMemAlloc(&address, size);
    if (result == CUDA_SUCCESS) {
      // One word per chunk, not the whole chunk: the test driver commits host pages for what is
      // written, and the point is the allocator's bookkeeping, not bandwidth.
      CU_CHECK(cuMemsetD32(address, chunk_word(chunks.size()), 1));
      chunks.push_back({address, size});
      held += size;
      continue;
    }
    ++refusals;
    if (result != kExpectedRefusal) {
      refusal = result;
      std::fprintf(stderr,
                   "oom_then_work: cuMemAlloc of %zu bytes, holding %zu in %zu chunks, returned "
                   "%s; expected %s\n",
                   size, held, chunks.size(), ex::error_name(result).c_str(),
                   ex::error_name(kExpectedRefusal).c_str());
      break;
    }
    refusal = result;
    size /= 2;
  }
  const double fill_ms = 1e3 * ex::seconds_since(start);
  CU_CHECK(cuCtxSynchronize());
  report.add("chunks", chunks.size());
  report.add("held_mib", held >> 20);
  report.add("refusals", refusals);
  report.add("refusal", refusal == CUDA_SUCCESS ? std::string("none") : ex::error_name(refusal));
  report.expect(refusal == kExpectedRefusal, "unexpected_refusal");
  if (held > device_bytes) {
    std::fprintf(stderr, "oom_then_work: held %zu bytes, more than the device's %zu, unrefused\n",
                 held, device_bytes);
  }
  report.expect(held <= device_bytes, "never_refused");

  long long corrupt = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    unsigned word = 0;
    CU_CHECK(cuMemcpyDtoH(&word, chunks[i].address, sizeof word));
    if (word != chunk_word(i)) {
      if (corrupt == 0) {
        std::fprintf(stderr, "oom_then_work: chunk %zu at 0x%llx holds 0x%08x, expected 0x%08x\n",
                     i, static_cast<unsigned long long>(chunks[i].address), word, chunk_word(i));
      }
      ++corrupt;
    }
  }
  report.add("corrupt_chunks", corrupt);
  report.expect(corrupt == 0, "chunks_corrupt");
  for (const Chunk& chunk : chunks) CU_CHECK(cuMemFree(chunk.address));

  // Then work, in the same context: c = a + b, exact.
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n);
  const auto a = ex::random_floats(n, 11);
  const auto b = ex::random_floats(n, 12);
  std::vector<float> c(n);
  CUdeviceptr da = 0, db = 0, dc = 0;
  CU_CHECK(cuMemAlloc(&da, bytes));
  CU_CHECK(cuMemAlloc(&db, bytes));
  CU_CHECK(cuMemAlloc(&dc, bytes));
  CU_CHECK(cuMemcpyHtoD(da, a.data(), bytes));
  CU_CHECK(cuMemcpyHtoD(db, b.data(), bytes));
  CU_CHECK(ex::launch_kernel(vector_add, {ex::blocks_for(n, kThreads)}, {kThreads}, nullptr, da, db,
                             dc, n));
  CU_CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
  long long mismatches = 0;
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) {
      if (mismatches == 0) {
        std::fprintf(stderr, "oom_then_work: c[%d] = %g, expected %g\n", i, c[i], a[i] + b[i]);
      }
      ++mismatches;
    }
  }
  report.add("n", n);
  report.add("mismatches", mismatches);
  report.add_fixed("fill_ms", fill_ms, 3);
  report.expect(mismatches == 0, "mismatches");

  CU_CHECK(cuMemFree(da));
  CU_CHECK(cuMemFree(db));
  CU_CHECK(cuMemFree(dc));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}

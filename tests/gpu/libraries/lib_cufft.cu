// cuFFT under the shim (cufftPlan1d fails with CUFFT_INTERNAL_ERROR when the shim refuses
// the tools-module table 6e163fbe). Plans and runs a batched 1-D C2C, a 2-D C2C and a
// batched R2C of a size that is not a power of two, each forward against a CPU DFT in double,
// then inverse (C2C inverse, C2R) back to N times the input.
#include <cufft.h>

#include <complex>
#include <vector>

#include "lib_common.hpp"

namespace {

using cdouble = std::complex<double>;
constexpr double kPi = 3.14159265358979323846;
#define FFT_OK(call) LIB_CHECK(call, CUFFT_SUCCESS)

// Naive DFT of `n` points spaced `stride` apart (forward sign), in double.
std::vector<cdouble> dft(const std::vector<cdouble>& in, int n, int stride, int offset) {
  std::vector<cdouble> out(n);
  for (int k = 0; k < n; ++k) {
    cdouble sum = 0;
    for (int j = 0; j < n; ++j) {
      sum += in[offset + j * stride] * std::polar(1.0, -2.0 * kPi * double(k) * j / n);
    }
    out[k] = sum;
  }
  return out;
}

// Largest |got - want| over the largest |want|.
double relative_error(const std::vector<cufftComplex>& got, const std::vector<cdouble>& want) {
  double err = 0;
  double scale = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(cdouble(got[i].x, got[i].y) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* device = nullptr;
  CUDA_OK(cudaMalloc(&device, host.size() * sizeof(T)));
  CUDA_OK(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}
template <typename T>
std::vector<T> host_copy(const T* device, std::size_t n) {
  std::vector<T> host(n);
  CUDA_OK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<cufftComplex> random_complex(std::size_t n, libcheck::Lcg& rng) {
  std::vector<cufftComplex> v(n);
  for (auto& c : v) c = {rng.uniform(), rng.uniform()};
  return v;
}

// |inverse(forward(x)) / n - x| over max |x|.
double roundtrip_error(const std::vector<cufftComplex>& back, const std::vector<cufftComplex>& x,
                       int n) {
  double err = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(cdouble(back[i].x / n - x[i].x, back[i].y / n - x[i].y)));
  }
  return err;
}

}  // namespace

int main() {
  libcheck::device_or_skip("lib_cufft");
  libcheck::Lcg rng(2024);
  libcheck::Digest digest;
  int version = 0;
  FFT_OK(cufftGetVersion(&version));

  // 1-D C2C, 256 points, batch 2, forward then inverse in place.
  constexpr int kN1 = 256, kBatch1 = 2;
  const auto x1 = random_complex(std::size_t(kN1) * kBatch1, rng);
  cufftHandle plan1;
  FFT_OK(cufftPlan1d(&plan1, kN1, CUFFT_C2C, kBatch1));
  cufftComplex* d1 = device_copy(x1);
  FFT_OK(cufftExecC2C(plan1, d1, d1, CUFFT_FORWARD));
  const auto y1 = host_copy(d1, x1.size());
  std::vector<cdouble> x1d(x1.size()), want1;
  for (std::size_t i = 0; i < x1.size(); ++i) x1d[i] = {x1[i].x, x1[i].y};
  for (int b = 0; b < kBatch1; ++b) {
    const auto part = dft(x1d, kN1, 1, b * kN1);
    want1.insert(want1.end(), part.begin(), part.end());
  }
  const double c2c1d_err = relative_error(y1, want1);
  FFT_OK(cufftExecC2C(plan1, d1, d1, CUFFT_INVERSE));
  const auto back1 = host_copy(d1, x1.size());
  double inverse_err = roundtrip_error(back1, x1, kN1);
  digest.add(y1);
  digest.add(back1);

  // 2-D C2C, 32 x 48 (row-major), out of place, then inverse.
  constexpr int kRows = 32, kCols = 48;
  const auto x2 = random_complex(std::size_t(kRows) * kCols, rng);
  cufftHandle plan2;
  FFT_OK(cufftPlan2d(&plan2, kRows, kCols, CUFFT_C2C));
  cufftComplex* d2 = device_copy(x2);
  cufftComplex* d2_out = nullptr;
  CUDA_OK(cudaMalloc(&d2_out, x2.size() * sizeof(cufftComplex)));
  FFT_OK(cufftExecC2C(plan2, d2, d2_out, CUFFT_FORWARD));
  const auto y2 = host_copy(d2_out, x2.size());
  std::vector<cdouble> rows(x2.size()), want2(x2.size());
  for (std::size_t i = 0; i < x2.size(); ++i) rows[i] = {x2[i].x, x2[i].y};
  for (int r = 0; r < kRows; ++r) {  // along each row, then along each column
    const auto part = dft(rows, kCols, 1, r * kCols);
    for (int c = 0; c < kCols; ++c) want2[r * kCols + c] = part[c];
  }
  for (int c = 0; c < kCols; ++c) {
    const auto part = dft(want2, kRows, kCols, c);
    for (int r = 0; r < kRows; ++r) rows[r * kCols + c] = part[r];
  }
  const double c2c2d_err = relative_error(y2, rows);
  FFT_OK(cufftExecC2C(plan2, d2_out, d2, CUFFT_INVERSE));
  const auto back2 = host_copy(d2, x2.size());
  inverse_err = std::max(inverse_err, roundtrip_error(back2, x2, kRows * kCols));
  digest.add(y2);
  digest.add(back2);

  // R2C, 200 points (2^3 x 5^2), batch 3, through the advanced interface; then C2R back.
  constexpr int kN3 = 200, kBatch3 = 3, kHalf = kN3 / 2 + 1;
  std::vector<float> x3(std::size_t(kN3) * kBatch3);
  for (auto& v : x3) v = rng.uniform();
  cufftHandle plan_r2c, plan_c2r;
  int n3 = kN3;
  FFT_OK(cufftPlanMany(&plan_r2c, 1, &n3, nullptr, 1, kN3, nullptr, 1, kHalf, CUFFT_R2C, kBatch3));
  FFT_OK(cufftPlanMany(&plan_c2r, 1, &n3, nullptr, 1, kHalf, nullptr, 1, kN3, CUFFT_C2R, kBatch3));
  float* d3 = device_copy(x3);
  cufftComplex* d3_freq = nullptr;
  CUDA_OK(cudaMalloc(&d3_freq, std::size_t(kHalf) * kBatch3 * sizeof(cufftComplex)));
  FFT_OK(cufftExecR2C(plan_r2c, d3, d3_freq));
  const auto y3 = host_copy(d3_freq, std::size_t(kHalf) * kBatch3);
  std::vector<cdouble> x3d(x3.begin(), x3.end()), want3;
  for (int b = 0; b < kBatch3; ++b) {
    const auto part = dft(x3d, kN3, 1, b * kN3);
    want3.insert(want3.end(), part.begin(), part.begin() + kHalf);
  }
  const double r2c_err = relative_error(y3, want3);
  FFT_OK(cufftExecC2R(plan_c2r, d3_freq, d3));
  const auto back3 = host_copy(d3, x3.size());
  for (std::size_t i = 0; i < x3.size(); ++i) {
    inverse_err = std::max(inverse_err, double(std::abs(back3[i] / kN3 - x3[i])));
  }
  digest.add(y3);
  digest.add(back3);

  for (cufftHandle plan : {plan1, plan2, plan_r2c, plan_c2r}) FFT_OK(cufftDestroy(plan));
  for (void* p : {static_cast<void*>(d1), static_cast<void*>(d2), static_cast<void*>(d2_out),
                  static_cast<void*>(d3), static_cast<void*>(d3_freq)}) {
    CUDA_OK(cudaFree(p));
  }

  // float FFTs of these sizes agree with double to ~1e-6 of the largest magnitude.
  constexpr double kTolerance = 1e-4;
  const bool ok = c2c1d_err < kTolerance && c2c2d_err < kTolerance && r2c_err < kTolerance &&
                  inverse_err < kTolerance;
  std::printf(
      "lib_cufft: version=%d c2c1d_err=%.3g c2c2d_err=%.3g r2c_err=%.3g inverse_err=%.3g "
      "digest=%016llx %s\n",
      version, c2c1d_err, c2c2d_err, r2c_err, inverse_err, digest.value(), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// cuBLASLt's low-precision paths under the shim (a bf16-autocast model dies when the shim
// refuses table 1734dc26 to libcublasLt). D = A^T B with A, B in bf16, and, on sm_90 and
// later, in fp8 e4m3 (the "TN" layout fp8 requires), fp32 accumulation, D in bf16. Inputs are
// multiples of 1/8, exact in both formats, so the CPU's fp32 sums are exact; D differs from
// them only by bf16 rounding.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <vector>

#include "lib_common.hpp"

namespace {

#define LT_OK(call) LIB_CHECK(call, CUBLAS_STATUS_SUCCESS)

constexpr int kM = 256, kN = 192, kK = 320;  // multiples of 16, as fp8 requires
constexpr std::size_t kWorkspaceBytes = 32 << 20;

struct Result {
  std::vector<__nv_bfloat16> d;
  double max_rel_err = 0;
};

// D (m x n, column-major) = A^T B, A stored k x m, B k x n, both column-major.
template <typename In>
Result matmul(cublasLtHandle_t lt, cudaDataType_t in_type, const std::vector<float>& a,
              const std::vector<float>& b, void* workspace) {
  std::vector<In> a_in(a.begin(), a.end()), b_in(b.begin(), b.end());
  In *da = nullptr, *db = nullptr;
  __nv_bfloat16* dd = nullptr;
  CUDA_OK(cudaMalloc(&da, a_in.size() * sizeof(In)));
  CUDA_OK(cudaMalloc(&db, b_in.size() * sizeof(In)));
  CUDA_OK(cudaMalloc(&dd, std::size_t(kM) * kN * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMemcpy(da, a_in.data(), a_in.size() * sizeof(In), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, b_in.data(), b_in.size() * sizeof(In), cudaMemcpyHostToDevice));

  cublasLtMatmulDesc_t op;
  LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                       sizeof transpose));
  LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none));
  cublasLtMatrixLayout_t la, lb, ld;
  LT_OK(cublasLtMatrixLayoutCreate(&la, in_type, kK, kM, kK));
  LT_OK(cublasLtMatrixLayoutCreate(&lb, in_type, kK, kN, kK));
  LT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, kM, kN, kM));
  cublasLtMatmulPreference_t preference;
  LT_OK(cublasLtMatmulPreferenceCreate(&preference));
  LT_OK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &kWorkspaceBytes, sizeof kWorkspaceBytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, preference, 1, &heuristic, &found));
  if (found == 0) {
    std::fprintf(stderr, "lib_cublaslt: no algorithm for type %d\n", int(in_type));
    std::exit(1);
  }
  const float alpha = 1.0f, beta = 0.0f;
  LT_OK(cublasLtMatmul(lt, op, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld, &heuristic.algo,
                       workspace, kWorkspaceBytes, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  Result result;
  result.d.resize(std::size_t(kM) * kN);
  CUDA_OK(cudaMemcpy(result.d.data(), dd, result.d.size() * sizeof(__nv_bfloat16),
                     cudaMemcpyDeviceToHost));
  double scale = 1e-30, err = 0;
  for (int j = 0; j < kN; ++j) {
    for (int i = 0; i < kM; ++i) {
      double want = 0;
      for (int k = 0; k < kK; ++k) {
        want += double(float(a_in[std::size_t(i) * kK + k])) *
                double(float(b_in[std::size_t(j) * kK + k]));
      }
      err = std::max(err,
                     std::abs(double(__bfloat162float(result.d[std::size_t(j) * kM + i])) - want));
      scale = std::max(scale, std::abs(want));
    }
  }
  result.max_rel_err = err / scale;

  LT_OK(cublasLtMatmulPreferenceDestroy(preference));
  for (auto layout : {la, lb, ld}) LT_OK(cublasLtMatrixLayoutDestroy(layout));
  LT_OK(cublasLtMatmulDescDestroy(op));
  CUDA_OK(cudaFree(da));
  CUDA_OK(cudaFree(db));
  CUDA_OK(cudaFree(dd));
  return result;
}

}  // namespace

int main() {
  libcheck::device_or_skip("lib_cublaslt");
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  libcheck::Lcg rng(7);
  std::vector<float> a(std::size_t(kK) * kM), b(std::size_t(kK) * kN);
  for (auto& v : a) v = rng.eighths();
  for (auto& v : b) v = rng.eighths();

  cublasLtHandle_t lt;
  LT_OK(cublasLtCreate(&lt));
  void* workspace = nullptr;
  CUDA_OK(cudaMalloc(&workspace, kWorkspaceBytes));

  libcheck::Digest digest;
  // bf16 keeps 8 significant bits: D's rounding is at most 2^-8 of its magnitude.
  constexpr double kTolerance = 1.0 / 128;
  const Result bf16 = matmul<__nv_bfloat16>(lt, CUDA_R_16BF, a, b, workspace);
  digest.add(bf16.d);
  bool ok = bf16.max_rel_err < kTolerance;
  char fp8_field[64] = "fp8=skipped_below_sm90";
  if (prop.major >= 9) {
    const Result fp8 = matmul<__nv_fp8_e4m3>(lt, CUDA_R_8F_E4M3, a, b, workspace);
    digest.add(fp8.d);
    ok = ok && fp8.max_rel_err < kTolerance;
    std::snprintf(fp8_field, sizeof fp8_field, "fp8_err=%.3g", fp8.max_rel_err);
  }
  CUDA_OK(cudaFree(workspace));
  LT_OK(cublasLtDestroy(lt));
  std::printf("lib_cublaslt: sm=%d%d version=%zu bf16_err=%.3g %s digest=%016llx %s\n", prop.major,
              prop.minor, cublasLtGetVersion(), bf16.max_rel_err, fp8_field, digest.value(),
              ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

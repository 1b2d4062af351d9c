// cuSPARSE's generic SpMV on a CSR matrix under the shim: y = alpha A x + beta y for a 1000 x 800
// matrix of about 1% fixed random entries, with CUSPARSE_SPMV_CSR_ALG2 (bit-for-bit the same
// on every run, so native and shim must agree exactly), against a CPU product in double.
#include <cusparse.h>

#include <vector>

#include "lib_common.hpp"

#define SPARSE_OK(call) LIB_CHECK(call, CUSPARSE_STATUS_SUCCESS)

int main() {
  libcheck::device_or_skip("lib_cusparse");
  constexpr int kRows = 1000, kCols = 800;
  libcheck::Lcg rng(99);
  std::vector<int> row_offsets{0}, columns;
  std::vector<float> values;
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      if (rng.next() % 100 == 0) {
        columns.push_back(c);
        values.push_back(rng.uniform());
      }
    }
    row_offsets.push_back(int(columns.size()));
  }
  std::vector<float> x(kCols), y(kRows);
  for (auto& v : x) v = rng.uniform();
  for (auto& v : y) v = rng.uniform();
  const float alpha = 1.5f, beta = -0.5f;

  int *d_offsets = nullptr, *d_columns = nullptr;
  float *d_values = nullptr, *d_x = nullptr, *d_y = nullptr;
  CUDA_OK(cudaMalloc(&d_offsets, row_offsets.size() * sizeof(int)));
  CUDA_OK(cudaMalloc(&d_columns, columns.size() * sizeof(int)));
  CUDA_OK(cudaMalloc(&d_values, values.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_x, x.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_y, y.size() * sizeof(float)));
  CUDA_OK(cudaMemcpy(d_offsets, row_offsets.data(), row_offsets.size() * sizeof(int),
                     cudaMemcpyHostToDevice));
  CUDA_OK(
      cudaMemcpy(d_columns, columns.data(), columns.size() * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(
      cudaMemcpy(d_values, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_y, y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice));

  cusparseHandle_t handle;
  SPARSE_OK(cusparseCreate(&handle));
  int version = 0;
  SPARSE_OK(cusparseGetVersion(handle, &version));
  cusparseSpMatDescr_t matrix;
  cusparseDnVecDescr_t vec_x, vec_y;
  SPARSE_OK(cusparseCreateCsr(&matrix, kRows, kCols, int64_t(values.size()), d_offsets, d_columns,
                              d_values, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                              CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  SPARSE_OK(cusparseCreateDnVec(&vec_x, kCols, d_x, CUDA_R_32F));
  SPARSE_OK(cusparseCreateDnVec(&vec_y, kRows, d_y, CUDA_R_32F));
  std::size_t buffer_bytes = 0;
  SPARSE_OK(cusparseSpMV_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, matrix, vec_x,
                                    &beta, vec_y, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2,
                                    &buffer_bytes));
  void* buffer = nullptr;
  CUDA_OK(cudaMalloc(&buffer, buffer_bytes > 0 ? buffer_bytes : 1));
  SPARSE_OK(cusparseSpMV(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, matrix, vec_x, &beta,
                         vec_y, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, buffer));
  std::vector<float> got(kRows);
  CUDA_OK(cudaMemcpy(got.data(), d_y, got.size() * sizeof(float), cudaMemcpyDeviceToHost));

  double err = 0, scale = 1e-30;
  for (int r = 0; r < kRows; ++r) {
    double sum = 0;
    for (int i = row_offsets[r]; i < row_offsets[r + 1]; ++i)
      sum += double(values[i]) * x[columns[i]];
    const double want = alpha * sum + beta * double(y[r]);
    err = std::max(err, std::abs(double(got[r]) - want));
    scale = std::max(scale, std::abs(want));
  }
  libcheck::Digest digest;
  digest.add(got);

  SPARSE_OK(cusparseDestroySpMat(matrix));
  SPARSE_OK(cusparseDestroyDnVec(vec_x));
  SPARSE_OK(cusparseDestroyDnVec(vec_y));
  SPARSE_OK(cusparseDestroy(handle));
  for (void* p :
       {static_cast<void*>(d_offsets), static_cast<void*>(d_columns), static_cast<void*>(d_values),
        static_cast<void*>(d_x), static_cast<void*>(d_y), buffer}) {
    CUDA_OK(cudaFree(p));
  }
  const double rel_err = err / scale;
  const bool ok = rel_err < 1e-5;  // fp32 sums of ~8 terms
  std::printf("lib_cusparse: version=%d nnz=%zu spmv_err=%.3g digest=%016llx %s\n", version,
              values.size(), rel_err, digest.value(), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

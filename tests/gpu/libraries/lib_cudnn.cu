// cuDNN v9 under the shim: a 3x3 convolution forward (N=2, C=3, 16x16, K=4 filters, padding 1)
// through cudnnConvolutionForward with IMPLICIT_GEMM and plain fp32 math (no TF32), against a
// CPU convolution. Inputs are multiples of 1/8, so the fp32 sums are exact.
#include <cudnn.h>

#include <vector>

#include "lib_common.hpp"

#define DNN_OK(call) LIB_CHECK(call, CUDNN_STATUS_SUCCESS)

int main() {
  libcheck::device_or_skip("lib_cudnn");
  constexpr int kN = 2, kC = 3, kH = 16, kW = 16, kK = 4, kR = 3, kS = 3, kPad = 1;
  libcheck::Lcg rng(5);
  std::vector<float> input(std::size_t(kN) * kC * kH * kW), filter(std::size_t(kK) * kC * kR * kS);
  for (auto& v : input) v = rng.eighths();
  for (auto& v : filter) v = rng.eighths();

  cudnnHandle_t dnn;
  DNN_OK(cudnnCreate(&dnn));
  cudnnTensorDescriptor_t in_desc, out_desc;
  cudnnFilterDescriptor_t filter_desc;
  cudnnConvolutionDescriptor_t conv;
  DNN_OK(cudnnCreateTensorDescriptor(&in_desc));
  DNN_OK(cudnnCreateTensorDescriptor(&out_desc));
  DNN_OK(cudnnCreateFilterDescriptor(&filter_desc));
  DNN_OK(cudnnCreateConvolutionDescriptor(&conv));
  DNN_OK(cudnnSetTensor4dDescriptor(in_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, kN, kC, kH, kW));
  DNN_OK(
      cudnnSetFilter4dDescriptor(filter_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, kK, kC, kR, kS));
  DNN_OK(cudnnSetConvolution2dDescriptor(conv, kPad, kPad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                         CUDNN_DATA_FLOAT));
  DNN_OK(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
  int on = 0, oc = 0, oh = 0, ow = 0;
  DNN_OK(cudnnGetConvolution2dForwardOutputDim(conv, in_desc, filter_desc, &on, &oc, &oh, &ow));
  DNN_OK(cudnnSetTensor4dDescriptor(out_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow));
  const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  std::size_t workspace_bytes = 0;
  DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(dnn, in_desc, filter_desc, conv, out_desc, algo,
                                                 &workspace_bytes));

  float *d_in = nullptr, *d_filter = nullptr, *d_out = nullptr;
  void* workspace = nullptr;
  const std::size_t out_count = std::size_t(on) * oc * oh * ow;
  CUDA_OK(cudaMalloc(&d_in, input.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_filter, filter.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_out, out_count * sizeof(float)));
  CUDA_OK(cudaMalloc(&workspace, workspace_bytes > 0 ? workspace_bytes : 1));
  CUDA_OK(cudaMemcpy(d_in, input.data(), input.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(
      cudaMemcpy(d_filter, filter.data(), filter.size() * sizeof(float), cudaMemcpyHostToDevice));
  const float alpha = 1.0f, beta = 0.0f;
  DNN_OK(cudnnConvolutionForward(dnn, &alpha, in_desc, d_in, filter_desc, d_filter, conv, algo,
                                 workspace, workspace_bytes, &beta, out_desc, d_out));
  std::vector<float> got(out_count);
  CUDA_OK(cudaMemcpy(got.data(), d_out, out_count * sizeof(float), cudaMemcpyDeviceToHost));

  double err = 0;
  for (int n = 0; n < kN; ++n) {
    for (int k = 0; k < kK; ++k) {
      for (int y = 0; y < kH; ++y) {
        for (int x = 0; x < kW; ++x) {
          double want = 0;
          for (int c = 0; c < kC; ++c) {
            for (int r = 0; r < kR; ++r) {
              for (int s = 0; s < kS; ++s) {
                const int iy = y + r - kPad, ix = x + s - kPad;
                if (iy < 0 || iy >= kH || ix < 0 || ix >= kW) continue;
                want += double(input[((std::size_t(n) * kC + c) * kH + iy) * kW + ix]) *
                        filter[((std::size_t(k) * kC + c) * kR + r) * kS + s];
              }
            }
          }
          err = std::max(
              err, std::abs(double(got[((std::size_t(n) * kK + k) * kH + y) * kW + x]) - want));
        }
      }
    }
  }
  libcheck::Digest digest;
  digest.add(got);

  CUDA_OK(cudaFree(d_in));
  CUDA_OK(cudaFree(d_filter));
  CUDA_OK(cudaFree(d_out));
  CUDA_OK(cudaFree(workspace));
  DNN_OK(cudnnDestroyConvolutionDescriptor(conv));
  DNN_OK(cudnnDestroyFilterDescriptor(filter_desc));
  DNN_OK(cudnnDestroyTensorDescriptor(in_desc));
  DNN_OK(cudnnDestroyTensorDescriptor(out_desc));
  DNN_OK(cudnnDestroy(dnn));
  const bool ok = on == kN && oc == kK && oh == kH && ow == kW && err == 0.0;
  std::printf("lib_cudnn: version=%zu out=%dx%dx%dx%d conv_err=%.3g digest=%016llx %s\n",
              cudnnGetVersion(), on, oc, oh, ow, err, digest.value(), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

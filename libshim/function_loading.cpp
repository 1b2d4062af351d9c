// cuFuncIsLoaded / cuFuncLoad: every function the shim hands out was looked up on the server,
// which loads it there (lazy loading happens on the server's driver), so it is loaded.
#include "libshim/api.hpp"
#include "libshim/client.hpp"

using namespace mpsshim::shim;

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction hfunc) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (object_of<Function>(hfunc) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *state = CU_FUNCTION_LOADING_STATE_LOADED;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncLoad(CUfunction hfunc) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  return object_of<Function>(hfunc) == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

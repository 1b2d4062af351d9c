// cuFuncIsLoaded / cuFuncLoad: a function is loaded once the server has looked it up (which
// loads it there: lazy loading happens on the server's driver). A library's kernel handed out
// from its listed names is not, until its first use or cuFuncLoad (kernel_lookup.hpp).
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/kernel_lookup.hpp"

using namespace mpsshim::shim;

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction hfunc) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *state = f->looked_up.load(std::memory_order_acquire) ? CU_FUNCTION_LOADING_STATE_LOADED
                                                        : CU_FUNCTION_LOADING_STATE_UNLOADED;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncLoad(CUfunction hfunc) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  return f == nullptr ? CUDA_ERROR_INVALID_HANDLE : usable(f);
}

// The one translation unit of the examples' device image. nvlink can link SASS from several
// files but not PTX, and the image must carry compute_XX PTX for every kernel (so that a newer
// GPU can JIT it), hence the kernel files are included into one compilation.
#include "diagnostics.cu"
#include "elementwise.cu"
#include "matmul.cu"
#include "timing.cu"

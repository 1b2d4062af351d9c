"""A Triton program under the shim: many small Triton kernels back to back (so that the server
batches them into graph launches, docs/launch-batching.md), checked against PyTorch's own result
computed on the CPU. Prints one result line; exit 0 only when every check holds.

    python3 tests/gpu/python/triton_check.py            # natively
    LD_PRELOAD=.../libmpsshim.so CUDA_MPS_PIPE_DIRECTORY=... python3 tests/gpu/python/triton_check.py
"""
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, a * x + y, mask=mask)


@triton.jit
def softmax_kernel(in_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(in_ptr + row * cols + offsets, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * cols + offsets, e / tl.sum(e, axis=0), mask=mask)


def main() -> int:
    torch.manual_seed(7)
    n, steps = 4096, 2000
    x = torch.randn(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    grid = (triton.cdiv(n, 1024),)
    # y <- 0.5 x + y, 2000 times in a row with no synchronization between. The same sum on the
    # CPU: a launch lost or run twice moves some element by 0.5 |x| (max |x| is ~4), far beyond
    # the rounding differences (a fused multiply-add on the GPU).
    for _ in range(steps):
        axpy_kernel[grid](x, y, y, 0.5, n, BLOCK=1024)
    torch.cuda.synchronize()
    expected = torch.zeros(n)
    x_cpu = x.cpu()
    for _ in range(steps):
        expected = 0.5 * x_cpu + expected
    axpy_err = (y.cpu() - expected).abs().max().item()

    rows, cols = 256, 781
    logits = torch.randn(rows, cols, device="cuda")
    probs = torch.empty_like(logits)
    for _ in range(200):
        softmax_kernel[(rows,)](logits, probs, cols, BLOCK=1024)
    torch.cuda.synchronize()
    softmax_err = (probs.cpu() - torch.softmax(logits.cpu(), dim=1)).abs().max().item()

    ok = axpy_err <= 1e-2 and softmax_err <= 1e-5
    print(f"triton_check: steps={steps} axpy_max_err={axpy_err:.3g} softmax_max_err={softmax_err:.3g} "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Hopper's TMA from Triton: kernels that load and store tiles through host-side tensor
descriptors (triton.tools.tensor_descriptor.TensorDescriptor; Triton encodes them with
cuTensorMapEncodeTiled before the launch), as FlashAttention-3, CUTLASS 3 and Triton's Hopper
matmuls move tiles. An elementwise kernel and a matmul, each checked against PyTorch's result;
the digest of the outputs must equal the native run's. Exit 77 without Triton's tensor
descriptors or a GPU older than sm_90.

    python3 tests/gpu/python/triton_tma_check.py
"""
import hashlib
import sys

try:
    import torch
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError as error:
    print(f"triton_tma_check: {error}: skipped")
    sys.exit(77)


@triton.jit
def scale_add_kernel(in_desc, out_desc, a, BM: tl.constexpr, BN: tl.constexpr):
    m = tl.program_id(0) * BM
    n = tl.program_id(1) * BN
    x = in_desc.load([m, n])
    out_desc.store([m, n], x * a + 1.0)


@triton.jit
def matmul_kernel(a_desc, b_desc, c_desc, K, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    m = tl.program_id(0) * BM
    n = tl.program_id(1) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(a_desc.load([m, k]), b_desc.load([k, n]))
    c_desc.store([m, n], acc.to(tl.float16))


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("triton_tma_check: needs sm_90 or newer: skipped")
        return 77
    torch.manual_seed(0)
    x = torch.randn(512, 256, device="cuda")
    y = torch.empty_like(x)
    scale_add_kernel[(512 // 64, 256 // 64)](TensorDescriptor.from_tensor(x, [64, 64]),
                                             TensorDescriptor.from_tensor(y, [64, 64]), 0.5,
                                             BM=64, BN=64)
    elementwise_ok = torch.equal(y, x * 0.5 + 1.0)
    M, N, K = 256, 256, 512
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    matmul_kernel[(M // 64, N // 64)](TensorDescriptor.from_tensor(a, [64, 64]),
                                      TensorDescriptor.from_tensor(b, [64, 64]),
                                      TensorDescriptor.from_tensor(c, [64, 64]), K,
                                      BM=64, BN=64, BK=64)
    want = (a.float() @ b.float())
    matmul_err = float((c.float() - want).abs().max() / want.abs().max())
    torch.cuda.synchronize()
    digest = hashlib.sha256(y.cpu().numpy().tobytes() + c.cpu().numpy().tobytes()).hexdigest()[:16]
    ok = elementwise_ok and matmul_err < 1e-2
    print(f"triton_tma_check: elementwise={elementwise_ok} matmul_err={matmul_err:.2g} "
          f"digest={digest} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch's expandable-segments allocator under the shim: it reserves virtual address space and
maps physical memory into it as it grows (cuMemAddressReserve, cuMemCreate, cuMemMap,
cuMemSetAccess: docs/vmm.md). Grows a pool through several sizes, frees and reuses it, and checks
a matmul chain against the CPU. Prints one result line; exit 0 only when every check holds.

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 tests/gpu/python/expandable_check.py
    (the same with LD_PRELOAD=.../libmpsshim.so CUDA_MPS_PIPE_DIRECTORY=... under the shim)
"""
import os
import sys

import torch


def main() -> int:
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    # Full fp32 matmuls, so the GPU's result can be held to the CPU's (TF32 is not).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(11)
    held = []
    for mib in (1, 4, 16, 64, 256, 64, 16):
        t = torch.full((mib << 18,), float(mib), device="cuda")  # 4-byte floats: mib MiB
        held.append(t)
    sums_ok = all(int(t.sum().item()) == t.numel() * int(t[0].item()) for t in held)
    reserved = torch.cuda.memory_reserved()
    del held
    torch.cuda.empty_cache()
    a = torch.randn(512, 512)
    # Scaled so each step shrinks differences: a chain of unscaled random matmuls amplifies the
    # rounding differences between the CPU's and the GPU's summation order chaotically.
    b = torch.randn(512, 512) * (0.5 / 512**0.5)
    ga, gb = a.cuda(), b.cuda()
    out = ga
    want = a
    for _ in range(8):
        out = torch.tanh(out @ gb)
        want = torch.tanh(want @ b)
    err = (out.cpu() - want).abs().max().item()
    ok = sums_ok and err < 1e-3 and reserved >= (421 << 20)
    print(f"expandable_check: conf={conf or 'default'} sums_ok={int(sums_ok)} "
          f"reserved_mib={reserved >> 20} max_abs_err={err:.3g} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

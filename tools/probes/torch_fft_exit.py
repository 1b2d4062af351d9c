#!/usr/bin/env python3
"""torch.fft at exit: under the shim this aborted at exit ("corrupted double-linked list", exit
134, 5 runs of 5 on an H100, 2026-11-25) while natively it exits 0. The cause was the shim's
per-thread state, destroyed by glibc before the exit handlers that still call the driver
(libshim/context.cpp, ThreadState). Run it natively and under the shim, several times:

  for i in 1 2 3 4 5; do LD_PRELOAD=... python3 tools/probes/torch_fft_exit.py; echo "exit $?"; done
"""
import torch

x = torch.arange(4096, dtype=torch.float32, device="cuda").to(torch.complex64)
y = torch.fft.fft(x)
z = torch.fft.ifft(y)
print(f"torch_fft_exit: sum_abs={y.abs().sum().item():.1f} "
      f"roundtrip_err={(z - x).abs().max().item():.2e}", flush=True)

#!/usr/bin/env python3
"""How long a PyTorch program takes from its start to its first result on the GPU (bench/harness.py's
"startup" workload).

It imports torch and torchvision, makes the CUDA context (one tensor on the GPU), builds
torchvision.models.resnet50() with random weights on the GPU, runs one batch-1 inference and reads
one number of its output back. The result line gives CLOCK_MONOTONIC instants in ns of each step's
end, which the harness subtracts from the instant it started the process:

  startup_client: imported_ns=.. cuda_ns=.. model_ns=.. result_ns=.. out_sum=.. PASS

out_sum lets the harness check that every mode computed the same thing. Any exception prints its
traceback on stderr and "startup_client: stage=<stage> error=<type> FAIL" on stdout.
"""
import sys
import time
import traceback


def main() -> int:
    stage = "import"
    try:
        import torch
        import torchvision

        imported_ns = time.monotonic_ns()
        stage = "cuda"
        torch.manual_seed(0)
        torch.ones(1, device="cuda")
        cuda_ns = time.monotonic_ns()
        stage = "model"
        model = torchvision.models.resnet50().cuda().eval()
        x = torch.randn(1, 3, 224, 224, device="cuda")
        model_ns = time.monotonic_ns()
        stage = "inference"
        with torch.no_grad():
            out_sum = float(model(x).sum().item())
        result_ns = time.monotonic_ns()
    except Exception as e:  # noqa: BLE001 - reported to the harness, which marks the run failed
        traceback.print_exc()
        print(f"startup_client: stage={stage} error={type(e).__name__} FAIL", flush=True)
        return 1
    print(f"startup_client: imported_ns={imported_ns} cuda_ns={cuda_ns} model_ns={model_ns} "
          f"result_ns={result_ns} out_sum={out_sum:.6f} PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

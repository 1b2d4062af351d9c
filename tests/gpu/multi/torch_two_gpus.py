"""PyTorch on two GPUs in one process: tensors copied from cuda:0 to cuda:1 and back (peer
copies), a computation on each GPU from the other's data, and nn.DataParallel over both. Under the
shim each GPU is a different server (docs/architecture.md, "Peer access"). Prints one result line
whose fields other than `gbps` must equal the native run's; exit 0 only when every check holds.

    python3 tests/gpu/multi/torch_two_gpus.py
"""
import sys
import time

import torch


def main() -> int:
    if torch.cuda.device_count() < 2:
        print(f"torch_two_gpus: gpus={torch.cuda.device_count()} FAIL (needs two)")
        return 1
    torch.manual_seed(3)
    x = torch.randn(1 << 20, device="cuda:0")
    y = x.to("cuda:1")
    z = (y * 2 + 1).to("cuda:0")
    round_trip = bool(torch.equal(z, x * 2 + 1))
    # A copy each way while peer access is on (PyTorch enables it for cross-device copies).
    w = torch.randn(1 << 16, device="cuda:1")
    via_peer = bool(torch.equal((x[: 1 << 16] + w.to("cuda:0")).cpu(),
                                x[: 1 << 16].cpu() + w.cpu()))
    # nn.DataParallel: replicas on both GPUs, outputs gathered on cuda:0.
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    model = model.to("cuda:0")
    batch = torch.randn(32, 64, device="cuda:0")
    expected = model(batch)
    parallel = torch.nn.DataParallel(model, device_ids=[0, 1])(batch)
    data_parallel = bool(torch.allclose(parallel, expected, atol=1e-5))
    # 256 MiB cuda:0 -> cuda:1, timed (not compared: a figure).
    big = torch.empty(64 << 20, dtype=torch.float32, device="cuda:0").fill_(1.5)
    dst = torch.empty_like(big, device="cuda:1")
    dst.copy_(big)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    reps = 10
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(big)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    gbps = reps * big.numel() * 4 / (time.perf_counter() - start) / 1e9
    big_ok = bool(dst.sum().item() == 1.5 * big.numel())
    ok = round_trip and via_peer and data_parallel and big_ok
    print(f"torch_two_gpus: round_trip={round_trip} via_peer={via_peer} "
          f"data_parallel={data_parallel} copy_256mib={big_ok} gbps={gbps:.1f} "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""NCCL collectives through torch.distributed, one process per GPU, NCCL's defaults (but NVLink
multicast off, as the GPU machines require): all-reduce, all-gather, reduce-scatter, broadcast
and send/recv, each checked; then 10 DDP steps whose parameters must agree across ranks. Run by
itself it starts the ranks (as many as GPUs, or --ranks N). Prints one result line per rank from
rank 0; exit 0 only when every check holds on every rank.

    python3 tests/gpu/multi/nccl_collectives.py [--ranks N] [--bench] [--one-gpu-each]

--one-gpu-each: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES=<rank>), as launchers that
give every task one GPU set it; NCCL then shares memory with GPUs the process does not see.
"""
import argparse
import os
import subprocess
import sys
import time


def rank_main(rank: int, world: int, bench: bool, local: int) -> int:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", local))
    dev = torch.device("cuda", local)
    checks = {}
    t = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    checks["all_reduce"] = bool(torch.all(t == world * (world + 1) / 2))
    parts = [torch.empty(1024, device=dev) for _ in range(world)]
    dist.all_gather(parts, torch.full((1024,), float(rank), device=dev))
    checks["all_gather"] = all(bool(torch.all(p == i)) for i, p in enumerate(parts))
    out = torch.empty(1024, device=dev)
    dist.reduce_scatter(out, [torch.full((1024,), float(rank + i), device=dev)
                              for i in range(world)])
    checks["reduce_scatter"] = bool(torch.all(out == sum(r + rank for r in range(world))))
    b = torch.full((4096,), float(rank), device=dev)
    dist.broadcast(b, src=0)
    checks["broadcast"] = bool(torch.all(b == 0))
    if world >= 2:
        peer = rank ^ 1
        if peer < world:
            s = torch.full((4096,), float(rank), device=dev)
            r = torch.empty(4096, device=dev)
            ops = [dist.P2POp(dist.isend, s, peer), dist.P2POp(dist.irecv, r, peer)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            checks["send_recv"] = bool(torch.all(r == peer))
    # DDP: 10 SGD steps; every rank ends with the same parameters.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    for _ in range(10):
        opt.zero_grad()
        loss = ddp(torch.randn(32, 128, device=dev)).square().mean()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    checks["ddp"] = all(bool(torch.equal(g, gathered[0])) for g in gathered)
    figures = ""
    if bench:
        figures = " " + bench_figures(dist, dev, world)
    dist.barrier()
    ok = all(checks.values())
    fields = " ".join(f"{k}={v}" for k, v in checks.items())
    # One write per line: the ranks share one stdout, and print() may write the text and its
    # newline apart, gluing another rank's line to this one.
    sys.stdout.write(f"nccl_collectives: rank={rank} world={world} {fields}{figures} "
                     f"{'PASS' if ok else 'FAIL'}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0 if ok else 1


def bench_figures(dist, dev, world) -> str:
    """All-reduce bus bandwidth at 256 MiB and latency at 8 KiB (nccl-tests' busbw), and a DDP
    training step's time: 4 x Linear(4096, 4096), batch 256, SGD, median of 30 steps after 5."""
    import torch
    out = []
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(256, 4096, device=dev)
    steps = []
    for i in range(35):
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize(dev)
        if i >= 5:
            steps.append(time.perf_counter() - start)
    steps.sort()
    out.append(f"ddp_step_ms={steps[len(steps) // 2] * 1e3:.3f}")
    for label, numel, reps in (("busbw_256mib", 64 << 20, 20), ("lat_8kib_us", 2048, 200)):
        t = torch.ones(numel, device=dev)
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        seconds = (time.perf_counter() - start) / reps
        if label.startswith("busbw"):
            out.append(f"{label}={numel * 4 / seconds / 1e9 * 2 * (world - 1) / world:.1f}")
        else:
            out.append(f"{label}={seconds * 1e6:.1f}")
    return " ".join(out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=0)
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--one-gpu-each", action="store_true")
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank >= 0:
        return rank_main(args.rank, int(os.environ["WORLD_SIZE"]), args.bench,
                         0 if args.one_gpu_each else args.rank)
    import torch
    world = args.ranks or torch.cuda.device_count()
    if world < 2:
        print(f"nccl_collectives: gpus={world} FAIL (needs two)")
        return 1
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000), NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    def rank_env(r):
        return dict(env, CUDA_VISIBLE_DEVICES=str(r)) if args.one_gpu_each else env
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r)]
                              + (["--bench"] if args.bench else [])
                              + (["--one-gpu-each"] if args.one_gpu_each else []),
                              env=rank_env(r))
             for r in range(world)]
    codes = [p.wait() for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())

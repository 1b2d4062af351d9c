"""PyTorch's cudaMallocAsync allocator sharing a tensor between processes through
torch.multiprocessing (docs/memory-pools.md): the parent fills a tensor from the stream-ordered
pool and hands it to a spawned child, which adds to it in place and returns its sum; the parent
then reads the child's writes. Prints one result line; exit 0 only when every check holds, 77
(skipped) where PyTorch itself refuses to share such a tensor: PyTorch 2.x on the H200 machine
raises "cudaMallocAsync does not yet support shareIpcHandle" natively, before any driver call.

    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 tests/gpu/python/torch_pool_share_check.py
    (the same with LD_PRELOAD=.../libmpsshim.so CUDA_MPS_PIPE_DIRECTORY=... under the shim)
"""
import os
import sys

import torch
import torch.multiprocessing as mp

N = 1 << 20


def child(inbox, outbox) -> None:
    shared = inbox.get()
    shared.add_(torch.arange(N, device=shared.device, dtype=torch.float32))
    torch.cuda.synchronize()
    outbox.put(float(shared.sum().item()))
    inbox.get()  # the parent has read the tensor: it may go now


def main() -> int:
    backend = torch.cuda.memory.get_allocator_backend()
    mp.set_start_method("spawn")
    tensor = torch.full((N,), 2.0, device="cuda")
    torch.cuda.synchronize()
    try:  # what putting it on the queue does, here where its refusal can be caught
        torch.multiprocessing.reductions.reduce_tensor(tensor)
    except RuntimeError as error:
        print(f"torch_pool_share_check: PyTorch {torch.__version__} refuses to share it: "
              f"{str(error).splitlines()[0]}: skipped", flush=True)
        return 77
    inbox, outbox = mp.Queue(), mp.Queue()
    worker = mp.Process(target=child, args=(inbox, outbox))
    worker.start()
    inbox.put(tensor)
    child_sum = outbox.get(timeout=120)
    parent_sum = float(tensor.sum().item())
    inbox.put("done")
    worker.join(timeout=60)
    want = 2.0 * N + (N - 1) * N / 2
    ok = (backend == "cudaMallocAsync" and worker.exitcode == 0 and child_sum == want
          and parent_sum == want and float(tensor[N - 1].item()) == 2.0 + N - 1)
    print(f"torch_pool_share_check: backend={backend} child_sum={child_sum:.0f} "
          f"parent_sum={parent_sum:.0f} last={float(tensor[N - 1].item()):.0f} "
          f"exitcode={worker.exitcode} {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

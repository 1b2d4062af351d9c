"""A PyTorch client for suspend_check.sh (mpsshimctl suspend / resume mid-run).

train STEPS HOLD_GIB: trains a small MLP for STEPS steps (deterministic algorithms, fixed seed)
while holding HOLD_GIB of random bytes, printing `STEP k` every 20 steps (each after a .item(),
so the program waits on the GPU there), then an inference pass; the digest of the weights and
the output, and whether the held bytes are unchanged.
hold GIB: holds GIB of random bytes, prints READY, waits for a line on stdin, then checks them.
want GIB: starts CUDA, prints STARTED, then times one allocation of GIB and the first kernel on
it (a fill, synchronized): `WANT seconds=S`; READY, and it holds them until a line on stdin.
"""
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def fingerprint(held):
    """The bytes' sum and a digest of every 4099th byte (a prime stride: every page is sampled).

    Summed 64 MiB at a time: a sum in int64 of the whole would hold an int64 copy of it (8 bytes
    per byte held), which the caching allocator then keeps."""
    total = 0
    piece = 64 << 20
    for at in range(0, held.numel(), piece):
        total += int(held[at:at + piece].sum(dtype=torch.int64))
    sample = held[::4099].cpu().numpy().tobytes()
    torch.cuda.empty_cache()
    return total, hashlib.sha256(sample).hexdigest()


def held_bytes(gib):
    if gib <= 0:
        return None, None
    n = int(gib * (1 << 30))
    g = torch.Generator(device="cuda").manual_seed(1)
    # In place: torch.randint would make its int64 draw first (8 bytes per byte held).
    held = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 256, generator=g)
    return held, fingerprint(held)


def train(steps, hold_gib):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    held, held_print = held_bytes(hold_gib)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device="cuda")
    y = torch.randn(512, 1024, device="cuda")
    for step in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"STEP {step} loss={loss.item():.6f} pid={os.getpid()}", flush=True)
    with torch.no_grad():
        out = model(x)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    digest.update(out.cpu().numpy().tobytes())
    held_ok = held is None or fingerprint(held) == held_print
    print(f"RESULT digest={digest.hexdigest()} held_ok={held_ok}", flush=True)
    return 0 if held_ok else 1


def hold(gib):
    held, held_print = held_bytes(gib)
    torch.cuda.synchronize()
    print(f"READY pid={os.getpid()}", flush=True)
    sys.stdin.readline()
    ok = fingerprint(held) == held_print
    print(f"RESULT held_ok={ok}", flush=True)
    return 0 if ok else 1


def want(gib):
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"STARTED pid={os.getpid()}", flush=True)
    start = time.perf_counter()
    wanted = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    # New memory holds no other client's bytes, even when it was preempted clients': its largest
    # byte is 0 (a reduction with no copy of the tensor, unlike count_nonzero).
    largest = int(wanted.max())
    wanted.fill_(7)
    torch.cuda.synchronize()
    print(f"WANT seconds={time.perf_counter() - start:.4f} largest_byte={largest}", flush=True)
    if torch.cuda.device_count() > 1:
        # GPU 1 reads all of it: its server maps each physical allocation the block is made of.
        copied = wanted.to("cuda:1")
        print(f"PEER min={int(copied.min())} max={int(copied.max())}", flush=True)
        del copied
    print(f"READY pid={os.getpid()}", flush=True)
    sys.stdin.readline()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "train":
        sys.exit(train(int(sys.argv[2]), float(sys.argv[3])))
    if sys.argv[1] == "want":
        sys.exit(want(float(sys.argv[2])))
    sys.exit(hold(float(sys.argv[2])))

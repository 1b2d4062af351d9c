#!/usr/bin/env python3
"""One PyTorch ResNet-50 batch-1 inference client (bench/harness.py's "resnet" workload).

torchvision.models.resnet50() with random weights, eval(), torch.no_grad(), one random
1x3x224x224 input, torch.cuda.synchronize() after every iteration. After --warmup iterations it
prints "# ready" and waits for one line on stdin holding a CLOCK_REALTIME instant in ns (0 = at
once), so that several copies time their loops together. The timed loop is --iters iterations in
--windows equal windows; the result line gives ms/iter overall and per window:

  resnet_client: iters=200 ms_per_iter=2.31 window_ms=2.30,2.31,... out_sum=.. start_ns=.. PASS

out_sum (the sum of one more forward pass's logits) lets the harness check that every mode
computed the same thing.

Any exception prints its traceback on stderr and "resnet_client: error=<type> FAIL" on stdout.
"""
import argparse
import sys
import time
import traceback


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--no-wait", action="store_true", help="start at once, without stdin")
    args = parser.parse_args()
    stage = "import"
    try:
        t0 = time.monotonic()
        import torch
        import torchvision

        stage = "model"
        torch.manual_seed(0)
        model = torchvision.models.resnet50().cuda().eval()
        x = torch.randn(1, 3, 224, 224, device="cuda")
        stage = "warmup"
        with torch.no_grad():
            for _ in range(args.warmup):
                model(x)
                torch.cuda.synchronize()
        init_s = time.monotonic() - t0
        if not args.no_wait:
            print(f"# ready init_s={init_s:.2f}", flush=True)
            line = sys.stdin.readline()
            go_ns = int(line.strip() or "0")
            now = time.time_ns()
            if go_ns > now:
                time.sleep((go_ns - now) / 1e9)
        stage = "timed"
        per_window = max(1, args.iters // max(1, args.windows))
        window_ms = []
        start_ns = time.time_ns()
        done = 0
        with torch.no_grad():
            while done < args.iters:
                n = min(per_window, args.iters - done)
                w0 = time.perf_counter()
                for _ in range(n):
                    model(x)
                    torch.cuda.synchronize()
                window_ms.append(1e3 * (time.perf_counter() - w0) / n)
                done += n
        end_ns = time.time_ns()
        ms = 1e-6 * (end_ns - start_ns) / args.iters
        with torch.no_grad():  # the same weights and input in every mode: the same logits
            out_sum = float(model(x).double().sum())
        print(f"resnet_client: iters={args.iters} ms_per_iter={ms:.4f} "
              f"window_ms={','.join(f'{w:.4f}' for w in window_ms)} init_s={init_s:.2f} "
              f"out_sum={out_sum:.9g} "
              f"start_ns={start_ns} end_ns={end_ns} PASS", flush=True)
        return 0
    except BaseException as error:  # noqa: BLE001 - any failure is the result
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        print(f"resnet_client: stage={stage} error={type(error).__name__} FAIL", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())

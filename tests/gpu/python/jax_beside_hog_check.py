"""JAX beside a process that holds most of the GPU (the situation that once made a JAX client
fault under the shim and take the GPU's other clients down): a holder process allocates
--hog-fraction of the GPU's memory with PyTorch and waits; JAX then jits and differentiates
sum(tanh(x @ w)) at 256x256 with XLA's defaults (preallocation, autotuning), which makes XLA
step its preallocation down and run its autotuner's kernels on host-mapped flags. Then the
holder checks its own memory. Prints one line; exit 0 only when JAX's value and gradient match
numpy and the holder's bytes survived. Exit 77 without jax or torch.

    python3 tests/gpu/python/jax_beside_hog_check.py [--hog-fraction 0.57]
"""
import argparse
import os
import subprocess
import sys

HOLDER = r"""
import sys, torch
total = torch.cuda.get_device_properties(0).total_memory
x = torch.empty(int(total * float(sys.argv[1])), dtype=torch.uint8, device='cuda')
x.fill_(7)
torch.cuda.synchronize()
print('holding', flush=True)
sys.stdin.readline()
print('intact' if bool((x[:1 << 20] == 7).all()) and int(x[-1]) == 7 else 'corrupt', flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hog-fraction", type=float, default=0.57)
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as error:
        print(f"jax_beside_hog_check: {error}: skipped")
        return 77
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(args.hog_fraction)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "holding":
        print("jax_beside_hog_check: the holder could not allocate FAIL")
        return 1
    env = dict(os.environ)
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    jax_run = subprocess.run([sys.executable, "-c", JAX_PROGRAM], env=env, capture_output=True,
                             text=True, timeout=240)
    holder.stdin.write("done\n")
    holder.stdin.flush()
    holder_says = holder.stdout.readline().strip()
    holder.wait(timeout=60)
    lines = [line for line in jax_run.stdout.splitlines() if line.startswith("jax: ")]
    if jax_run.returncode == 77:
        print("jax_beside_hog_check: jax has no CUDA backend: skipped")
        return 77
    fields = lines[-1][5:] if lines else f"exit={jax_run.returncode}"
    ok = bool(lines) and lines[-1].endswith("ok") and holder_says == "intact"
    if not ok:
        sys.stderr.write(jax_run.stderr[-3000:])
    print(f"jax_beside_hog_check: {fields.replace(' ok', '')} holder={holder_says} "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


JAX_PROGRAM = r"""
import sys
try:
    import jax, jax.numpy as jnp, numpy as np
    gpus = jax.devices('gpu')
except Exception as error:
    print(f'jax: {error}'); sys.exit(77)
jax.config.update('jax_default_matmul_precision', 'highest')
kx, kw = jax.random.split(jax.random.PRNGKey(0))
x = jax.device_put(jax.random.normal(kx, (256, 256), jnp.float32), gpus[0])
w = jax.device_put(jax.random.normal(kw, (256, 256), jnp.float32) / 16, gpus[0])
f = lambda x, w: jnp.sum(jnp.tanh(x @ w))
value, grad = jax.jit(jax.value_and_grad(f, argnums=1))(x, w)
xn, wn = np.asarray(x, np.float64), np.asarray(w, np.float64)
t = np.tanh(xn @ wn)
value_err = abs(float(value) - t.sum()) / abs(t.sum())
grad_err = float(np.max(np.abs(np.asarray(grad) - xn.T @ (1 - t**2))) / np.max(np.abs(xn.T @ (1 - t**2))))
good = value_err < 1e-4 and grad_err < 1e-3
# Pass/fail only: XLA's autotuner may pick another algorithm per run, so the errors' digits vary.
print(f'jax: value={value_err < 1e-4} grad={grad_err < 1e-3}' + (' ok' if good else ' bad'))
"""

if __name__ == "__main__":
    sys.exit(main())

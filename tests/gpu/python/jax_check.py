"""JAX/XLA under the shim (it once failed with "no supported devices found for platform
CUDA"): jit and grad of f(x) = sum(tanh(x @ w)^2) in fp32 on the GPU, against the analytic
gradient in numpy.
XLA's autotuner is off and its ops deterministic, so native and shim runs must print the same
digest. Exit 77 when jax is not installed or has no CUDA backend natively (the runner then
skips the row; under the shim after a native PASS the same answer is a failure).
"""
import hashlib
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # not 75% of the GPU
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true")

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except ImportError as error:
    print(f"jax_check: {error}: skipped")
    sys.exit(77)


def main() -> int:
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as error:
        print(f"jax_check: no CUDA backend ({error}): skipped")
        return 77
    jax.config.update("jax_default_matmul_precision", "highest")
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.device_put(jax.random.normal(kx, (64, 128), jnp.float32), gpus[0])
    w = jax.device_put(jax.random.normal(kw, (128, 32), jnp.float32) / 16, gpus[0])

    def f(x, w):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    value, grad = jax.jit(jax.value_and_grad(f))(x, w)
    value, grad = np.asarray(value), np.asarray(grad)
    xn, wn = np.asarray(x, np.float64), np.asarray(w, np.float64)
    t = np.tanh(xn @ wn)
    want_value = np.sum(t**2)
    want_grad = (2 * t * (1 - t**2)) @ wn.T
    value_err = abs(float(value) - want_value) / abs(want_value)
    grad_err = float(np.max(np.abs(grad - want_grad)) / np.max(np.abs(want_grad)))
    digest = hashlib.sha256(value.tobytes() + grad.tobytes()).hexdigest()[:16]
    ok = value_err < 1e-5 and grad_err < 1e-4
    print(f"jax_check: platform={gpus[0].platform} value_err={value_err:.3g} "
          f"grad_err={grad_err:.3g} digest={digest} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""numba.cuda under the shim: a JIT-compiled saxpy and an integer histogram with atomics, against
numpy. Exit 77 when numba is not installed or numba.cuda finds no GPU.
"""
import hashlib
import sys

try:
    import numpy as np
    from numba import cuda
except (ImportError, AttributeError) as error:
    # AttributeError: a numba older than the installed numpy (numpy 2 removed row_stack, which
    # numba 0.60 still registers), as on the H100 machine: numba does not import at all.
    print(f"numba_check: numba does not import: {error}: skipped")
    sys.exit(77)


def main() -> int:
    if not cuda.is_available():
        print("numba_check: numba.cuda finds no GPU: skipped")
        return 77

    @cuda.jit
    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def histogram(values, bins):
        i = cuda.grid(1)
        if i < values.size:
            cuda.atomic.add(bins, values[i] % bins.size, 1)

    rng = np.random.RandomState(11)
    n = 1 << 16
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    values = rng.randint(0, 1 << 20, n).astype(np.int32)
    out = cuda.device_array(n, np.float32)
    bins = cuda.to_device(np.zeros(64, np.int32))
    threads = 256
    saxpy[(n + threads - 1) // threads, threads](np.float32(2.5), cuda.to_device(x),
                                                 cuda.to_device(y), out)
    histogram[(n + threads - 1) // threads, threads](cuda.to_device(values), bins)
    got, got_bins = out.copy_to_host(), bins.copy_to_host()
    saxpy_err = float(np.max(np.abs(got - (np.float32(2.5) * x + y))))
    bins_equal = bool(np.array_equal(got_bins, np.bincount(values % 64, minlength=64)))
    digest = hashlib.sha256(got.tobytes() + got_bins.tobytes()).hexdigest()[:16]
    ok = saxpy_err < 1e-5 and bins_equal
    print(f"numba_check: saxpy_err={saxpy_err:.3g} bins_equal={int(bins_equal)} digest={digest} "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AttributeError as error:
        # The same numba/numpy mismatch, met lazily at the first JIT compile (numba's typing
        # registers np.row_stack, which numpy 2 removed): numba cannot run here at all, natively
        # or under the shim. Any other error is a failure.
        if "numpy" not in str(error):
            raise
        print(f"numba_check: numba does not work with this numpy: {error}: skipped")
        sys.exit(77)

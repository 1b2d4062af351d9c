"""CuPy's FFT (cuFFT underneath) under the shim: fft, ifft, fft2 and rfft of fixed random data
against numpy.fft. Exit 77 when cupy is not installed or sees no GPU.
"""
import hashlib
import sys

try:
    import cupy
    import numpy as np
except ImportError as error:
    print(f"cupy_fft_check: {error}: skipped")
    sys.exit(77)


def main() -> int:
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception as error:  # cupy raises its own CUDARuntimeError without a driver
        print(f"cupy_fft_check: no CUDA device ({error}): skipped")
        return 77
    rng = np.random.RandomState(7)
    x = (rng.standard_normal((4, 384)) + 1j * rng.standard_normal((4, 384))).astype(np.complex64)
    image = (rng.standard_normal((48, 40)) + 1j * rng.standard_normal((48, 40))).astype(np.complex64)
    real = rng.standard_normal((3, 250)).astype(np.float32)
    got = {
        "fft": cupy.fft.fft(cupy.asarray(x)),
        "ifft": cupy.fft.ifft(cupy.asarray(x)),
        "fft2": cupy.fft.fft2(cupy.asarray(image)),
        "rfft": cupy.fft.rfft(cupy.asarray(real)),
    }
    want = {"fft": np.fft.fft(x), "ifft": np.fft.ifft(x), "fft2": np.fft.fft2(image),
            "rfft": np.fft.rfft(real)}
    digest = hashlib.sha256()
    errors = {}
    for name in got:
        g = cupy.asnumpy(got[name])
        digest.update(g.tobytes())
        errors[name] = float(np.max(np.abs(g - want[name])) / np.max(np.abs(want[name])))
    ok = all(e < 1e-5 for e in errors.values())
    fields = " ".join(f"{name}_err={e:.3g}" for name, e in errors.items())
    print(f"cupy_fft_check: {fields} digest={digest.hexdigest()[:16]} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A process that holds most of GPU 0's memory, through the driver API alone (ctypes on
libcuda.so.1, so that under LD_PRELOAD it is a client of the shim like any other): it allocates
1 GiB chunks, then smaller ones, until --leave bytes are free, fills each with a pattern and
prints "holding BYTES free BYTES". When a line arrives on stdin (or stdin closes) it reads back
the first and last byte of every chunk and prints "intact" or "corrupt ..." (exit 1), or the
failing call's error (exit 2). The bystander of tests/gpu/oom_matrix.sh.

    python3 tests/gpu/python/memory_hog.py --leave 1G
"""
import argparse
import ctypes
import sys

PATTERN = 0x5A


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leave", type=parse_size, required=True, help="bytes left free")
    args = parser.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(name, *call_args):
        result = getattr(cuda, name)(*call_args)
        if result != 0:
            print(f"memory_hog: {name} failed with CUresult {result}", flush=True)
            sys.exit(2)

    check("cuInit", 0)
    device = ctypes.c_int()
    check("cuDeviceGet", ctypes.byref(device), 0)
    context = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    check("cuCtxSetCurrent", context)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    chunks = []
    size = 1 << 30
    while size >= (16 << 20):
        check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        if free.value < args.leave + size:
            size //= 2
            continue
        pointer = ctypes.c_uint64()
        if cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) != 0:
            size //= 2
            continue
        check("cuMemsetD8_v2", pointer, ctypes.c_ubyte(PATTERN), ctypes.c_size_t(size))
        chunks.append((pointer.value, size))
    check("cuCtxSynchronize")
    check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    held = sum(s for _, s in chunks)
    print(f"holding {held} free {free.value}", flush=True)
    sys.stdin.readline()
    byte = ctypes.c_ubyte()
    for pointer, chunk_size in chunks:
        for offset in (0, chunk_size - 1):
            check("cuMemcpyDtoH_v2", ctypes.byref(byte), ctypes.c_uint64(pointer + offset),
                  ctypes.c_size_t(1))
            if byte.value != PATTERN:
                print(f"corrupt at {pointer + offset:#x}: {byte.value:#x}", flush=True)
                return 1
    print("intact", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

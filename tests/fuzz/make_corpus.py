#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (tests/fuzz/corpus/<target>/): small valid inputs,
built from the proto/ layouts by hand. Run from anywhere: python3 tests/fuzz/make_corpus.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
NO_REPLY = 0xFF  # fuzz_ring_records: the slot byte that means kNoReply

# proto/ops.hpp opcodes used below.
PING, GOODBYE, CTX_CREATE, CTX_DESTROY, CTX_SYNC = 2, 1, 3, 4, 5
MEM_ALLOC, MEM_FREE, MEM_GET_INFO, COPY_HTOD, COPY_DTOD, MEMSET = 8, 10, 11, 14, 16, 17
IMAGE_LOAD, MODULE_GET_FUNCTION, LIBRARY_GET_KERNEL, LAUNCH = 18, 20, 23, 32
LIBRARY_KERNEL_NAMES = 104
STREAM_CREATE, STREAM_SYNC, EVENT_CREATE, EVENT_RECORD, EVENT_QUERY = 33, 36, 38, 40, 41
VMM_CREATE, VMM_RELEASE, VMM_RESERVE, VMM_ADDRESS_FREE, VMM_MAP, VMM_UNMAP = 79, 80, 81, 82, 83, 84
VMM_SET_ACCESS, VMM_GET_ACCESS, VMM_RETAIN = 85, 86, 88
MODULE_IMAGE = 9  # proto::MessageKind::kModuleImage


def record(opcode, payload=b"", slot=NO_REPLY, flags=0, size=None):
    mode = 0 if size is None else 1
    out = struct.pack("<BBHBHB", opcode & 0xFF, opcode >> 8, flags, slot, len(payload), mode)
    if size is not None:
        out += struct.pack("<I", size)
    return out + payload


def memfd(kind, token, content):
    return struct.pack("<BBIH", 0xFF, kind, token, len(content)) + content


def fatbin(fat_size):
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, fat_size) + bytes(fat_size)


def elf64(sections=1):
    header = bytearray(64)
    header[0:4] = b"\x7fELF"
    header[4] = 2  # ELFCLASS64
    struct.pack_into("<Q", header, 0x28, 64)  # e_shoff
    struct.pack_into("<HH", header, 0x3A, 64, sections)  # e_shentsize, e_shnum
    body = bytearray(64 * sections)
    for i in range(sections):
        struct.pack_into("<IIQQQQ", body, 64 * i, 0, 1, 0, 0, 64 + 64 * sections, 8)
    return bytes(header + body) + bytes(8)


def hello(kind, visible=b"", device=0, limit=0, flags=0, program=b"vector_add"):
    out = struct.pack("<IHHII", 0x4853504D, 1, 2, 368, kind)
    out += struct.pack("<iiiiQII", 4123, device, -1, -1, limit, flags, 0)
    return out + visible.ljust(256, b"\0") + program.ljust(64, b"\0")


def text_message(kind, text):
    out = struct.pack("<IHHII", 0x4853504D, 1, 2, 8192, kind)
    out += struct.pack("<iI", 0, len(text))
    return out + text.ljust(8168, b"\0")


def handle(index):
    """The id of a fresh session's index-th object: client 1's salt (session.cpp) << 32 | index."""
    return (0x9E3779B1 << 32) | index


CTX = handle(1)  # the first handle a fresh session's server issues
DPTR = 0x621000000100  # the fake driver's first allocation (a host address; may differ)
VA = 0x7E0000000000  # the fake driver's first VMM reservation (fake_vmm.cpp)
ctx_create = record(CTX_CREATE, struct.pack("<II", 0, 0), slot=0)

RING = {
    "ping": record(PING, slot=0),
    "memory": ctx_create
    + record(MEM_ALLOC, struct.pack("<QQ", CTX, 4096), slot=1)
    + record(MEM_GET_INFO, slot=2)
    + record(MEMSET, struct.pack("<QQQQQII", 0, DPTR, 0, 1024, 1, 7, 1))
    + record(COPY_DTOD, struct.pack("<QQQQ", 0, DPTR + 2048, DPTR, 1024))
    + record(MEM_FREE, struct.pack("<Q", DPTR))
    + record(CTX_DESTROY, struct.pack("<Q", CTX))
    + record(GOODBYE),
    "stream_event": ctx_create
    + record(STREAM_CREATE, struct.pack("<QIi", CTX, 0, 0), slot=1)
    + record(EVENT_CREATE, struct.pack("<QII", CTX, 0, 0), slot=2)
    + record(EVENT_RECORD, struct.pack("<QQII", handle(4), handle(3), 0, 0))
    + record(EVENT_QUERY, struct.pack("<Q", handle(4)), slot=3)
    + record(STREAM_SYNC, struct.pack("<Q", handle(3)), slot=4)
    + record(CTX_SYNC, struct.pack("<Q", CTX), slot=5),
    "module_launch": ctx_create
    + memfd(MODULE_IMAGE, 9, fatbin(64))
    + record(IMAGE_LOAD, struct.pack("<QQIIII", CTX, 80, 9, 1, 0, 0), slot=1)
    + record(MODULE_GET_FUNCTION, struct.pack("<QII", handle(3), 4, 0) + b"kern", slot=2)
    + record(LAUNCH, struct.pack("<QQ3I3IIIII", handle(4), 0, 1, 1, 1, 32, 1, 1, 0, 8, 0, 0) + bytes(8)),
    # A library's load that lists its kernels' names (flags 1), the next page of them, a lookup.
    "library_names": ctx_create
    + memfd(MODULE_IMAGE, 9, fatbin(64))
    + record(IMAGE_LOAD, struct.pack("<QQIIII", CTX, 80, 9, 2, 0, 1), slot=1)
    + record(LIBRARY_KERNEL_NAMES, struct.pack("<QII", handle(3), 1, 0), slot=2)
    + record(LIBRARY_GET_KERNEL, struct.pack("<QII", handle(3), 1, 0) + b"k", slot=3)
    + record(LAUNCH, struct.pack("<QQ3I3IIIII", handle(4), 0, 1, 1, 1, 32, 1, 1, 0, 12, 0, 0) + bytes(12)),
    # proto/ops_vmm.hpp: VmmProp is <IIIBBH (pinned, no handle types, device).
    "vmm": record(VMM_CREATE, struct.pack("<IIIBBHIQQ", 1, 0, 1, 0, 0, 0, 0, 2 << 20, 0), slot=0)
    + record(VMM_RESERVE, struct.pack("<QQQQ", 4 << 20, 0, 0, 0), slot=1)
    + record(VMM_MAP, struct.pack("<QQQQQ", VA, 2 << 20, 0, handle(1), 0), slot=2)
    + record(VMM_SET_ACCESS, struct.pack("<QQII", VA, 2 << 20, 1, 0) + struct.pack("<II", 1, 3),
             slot=3)
    + record(VMM_GET_ACCESS, struct.pack("<QII", VA + 64, 1, 0), slot=4)
    + record(VMM_RETAIN, struct.pack("<Q", VA), slot=5)
    + record(VMM_UNMAP, struct.pack("<QQ", VA, 2 << 20), slot=6)
    + record(VMM_RELEASE, struct.pack("<Q", handle(1)), slot=7)
    + record(VMM_ADDRESS_FREE, struct.pack("<QQ", VA, 4 << 20), slot=8),
    "short_record": record(COPY_HTOD, bytes(24)),
    "bad_size": record(PING, slot=0, size=12),
    "corrupt_head": ctx_create + bytes([0xFE]) + struct.pack("<h", 4096),
}

CONTROL = {
    "attach": hello(3),
    "query_visible": hello(1, visible=b"1,0"),
    "query_uuid": hello(1, visible=b"GPU-00010203-0405"),
    "attach_limit": hello(3, device=1, visible=b"2,1", limit=1 << 30, flags=3),
    "ctl_ps": text_message(10, b"ps"),
}

IMAGE = {
    "fatbin": struct.pack("<I", 1) + fatbin(32),
    "two_fatbins": struct.pack("<I", 2) + fatbin(16) + fatbin(8),
    "elf": struct.pack("<I", 0) + elf64(),
    "ptx": struct.pack("<I", 0) + b".version 8.0\n.target sm_90\n\0",
}

LIMITS = {
    "size": b"4G",
    "per_device": b"0=1G,1=512M",
    "set_limit": b"set_default_device_pinned_mem_limit 0 2G",
    "ps": b"ps",
    "terminate": b"terminate_client 0 4123",
    "percentage": b"set_default_active_thread_percentage 50",
}

for target, seeds in [("fuzz_ring_records", RING), ("fuzz_control_messages", CONTROL),
                      ("fuzz_image", IMAGE), ("fuzz_limits", LIMITS)]:
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)

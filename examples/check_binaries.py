#!/usr/bin/env python3
"""Checks that the example and benchmark programs can run natively AND under the shim.

usage: check_binaries.py --readelf READELF --image IMAGE.fatbin PROGRAM...

For every program:
  * DT_NEEDED names libcuda.so.1 (libmpsshim's SONAME) and neither libcudart nor libmpsshim;
  * no RUNPATH/RPATH directory holds a file named libcuda.so.1: such an entry would shadow the
    real driver when the program runs natively;
  * the device image is embedded byte for byte, and it starts with the fatbin magic 0xBA55ED50.
"""

import argparse
import os
import re
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
DYNAMIC_ENTRY = re.compile(r"\((NEEDED|RUNPATH|RPATH)\)\s+.*\[(.*)\]")


def dynamic_entries(readelf, program):
    output = subprocess.run([readelf, "-d", "-W", program], check=True, capture_output=True,
                            text=True).stdout
    entries = {"NEEDED": [], "RUNPATH": [], "RPATH": []}
    for match in DYNAMIC_ENTRY.finditer(output):
        entries[match.group(1)].append(match.group(2))
    return entries


def check_program(readelf, program, image):
    problems = []
    entries = dynamic_entries(readelf, program)
    needed = entries["NEEDED"]
    if "libcuda.so.1" not in needed:
        problems.append(f"DT_NEEDED lacks libcuda.so.1: {needed}")
    for name in needed:
        if name.startswith("libcudart") or name.startswith("libmpsshim"):
            problems.append(f"DT_NEEDED names {name}")
    origin = os.path.dirname(os.path.abspath(program))
    for kind in ("RUNPATH", "RPATH"):
        for value in entries[kind]:
            for directory in value.split(":"):
                resolved = directory.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                if os.path.exists(os.path.join(resolved, "libcuda.so.1")):
                    problems.append(f"{kind} {directory} holds a libcuda.so.1 that would shadow "
                                    "the real driver")
    with open(program, "rb") as f:
        if image not in f.read():
            problems.append("the device image is not embedded")
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--readelf", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("programs", nargs="+")
    args = parser.parse_args()

    with open(args.image, "rb") as f:
        image = f.read()
    failed = False
    if len(image) < 16 or struct.unpack_from("<I", image)[0] != FATBIN_MAGIC:
        print(f"FAIL {args.image}: does not start with the fatbin magic 0x{FATBIN_MAGIC:08X}")
        failed = True
    for program in args.programs:
        problems = check_program(args.readelf, program, image)
        for problem in problems:
            print(f"FAIL {os.path.basename(program)}: {problem}")
        if not problems:
            print(f"ok   {os.path.basename(program)}: NEEDED libcuda.so.1, no shadowing RUNPATH, "
                  f"image of {len(image)} bytes embedded")
        failed = failed or bool(problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

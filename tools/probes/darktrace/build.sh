#!/usr/bin/env bash
# Builds libdarktrace.so with nothing but g++ and cuda.h (no meson, no mpsshim build), e.g. on
# the GPU machine:  bash tools/probes/darktrace/build.sh [OUT_DIR]   (default: this directory)
# CUDA_INCLUDE overrides where cuda.h is (default /usr/local/cuda/include).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
g++ -std=c++20 -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden \
  -I"${CUDA_INCLUDE:-/usr/local/cuda/include}" \
  -o "$out/libdarktrace.so" \
  "$here/interpose.cpp" "$here/traced_tables.cpp" "$here/trace_log.cpp" "$here/memory_peek.cpp" \
  -ldl
echo "$out/libdarktrace.so"

#!/usr/bin/env bash
# Copies what the GPU suite (tests/gpu/gpu_suite.sh), the soak (tests/gpu/soak.sh: the daemon,
# server, shim and examples/; bench/resnet_client.py comes from the source tree) and
# bench/harness.py need out of a build
# directory into a small tree of the same layout, stripped, with the shared libraries a fresh
# GPU machine lacks (libfmt, toml++) in OUT/lib. A whole debug build is ~700 MiB; this is ~40 MiB,
# small enough to carry to the GPU machine. There:
#
#   export LD_LIBRARY_PATH=$PWD/OUT/lib
#   bash tests/gpu/gpu_suite.sh --build-dir OUT
#   bash tests/gpu/soak.sh --build-dir OUT --minutes 8
#   python3 bench/harness.py --build-dir OUT --out /tmp/bench --quick
#   LD_LIBRARY_PATH=$PWD/OUT/lib:$PWD/OUT/k8s-lib bash tests/gpu/k8s_allocation.sh  # with the
#     variables it names set to OUT's programs (docs/kubernetes.md)
#   bash tests/gpu/libraries.sh --build-dir OUT   # the CUDA libraries alone
#
# The library programs (tests/gpu/libraries) find cuFFT, cuBLASLt, ... through their RUNPATH to
# the build machine's CUDA lib64 (/usr/local/cuda/lib64); LD_LIBRARY_PATH overrides it.
#
# usage: tools/gpu_pack.sh BUILD OUT   (OUT is replaced)
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD OUT" >&2; exit 2; }
build=$(realpath "$1")
out=$2
rm -rf "$out"
mkdir -p "$out/lib"

copy() {  # a build-relative path, kept at the same place under OUT
  mkdir -p "$out/$(dirname "$1")"
  cp "$build/$1" "$out/$1"
  strip --strip-debug "$out/$1" 2>/dev/null || true
}
copy libshim/libmpsshim.so
copy libshim/nvml/libmpsshim-nvml.so
for program in broker/daemon/mpsshimd broker/daemon/mpsshimctl broker/server/mpsshim-server \
  tests/gpu/integrity_vs_driver; do
  copy "$program"
done
# The private-table tracer for the real driver (tools/probes/darktrace/README.md).
copy tools/probes/darktrace/libdarktrace.so
for dir in examples bench tests/gpu/programs tests/gpu/libraries tests/cudart; do
  while IFS= read -r file; do copy "${file#"$build"/}"; done \
    < <(find "$build/$dir" -maxdepth 1 -type f -perm -u+x)
done
# Debian's libraries the daemon, server and shim link that a GPU machine may lack (mpsshimd
# reads its configuration file with toml++).
for soname in libfmt.so.9 libtomlplusplus.so.3; do
  cp -L "$(ldconfig -p | awk -v name="$soname" '$1 == name {print $NF; exit}')" "$out/lib/"
done

# The Kubernetes device plugin and the test's kubelet stand-in, where they were built
# (tests/gpu/k8s_allocation.sh), with Debian's gRPC, protobuf, abseil, toml++ and their own
# dependencies in OUT/k8s-lib: a separate directory, so that only a command that asks for it
# (LD_LIBRARY_PATH=OUT/lib:OUT/k8s-lib) sees Debian's libssl, libcrypto and libz instead of the
# GPU machine's.
if [ -x "$build/deviceplugin/mpsshim-device-plugin" ] && [ -x "$build/tests/deviceplugin/kubelet_cli" ]; then
  copy deviceplugin/mpsshim-device-plugin
  copy tests/deviceplugin/kubelet_cli
  mkdir -p "$out/k8s-lib"
  ldd "$build/deviceplugin/mpsshim-device-plugin" "$build/tests/deviceplugin/kubelet_cli" |
    awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt|libfmt)\.so' |
    while IFS= read -r library; do cp -L "$library" "$out/k8s-lib/"; done
fi
du -sh "$out"

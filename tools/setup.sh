#!/usr/bin/env bash
# Installs what building mpsshim needs when it is missing (Debian 12 or Ubuntu, with apt-get: as
# root, or through sudo), then configures and builds BUILD_DIR (default: build).
#
#   bash tools/setup.sh [--build-dir DIR] [--no-build] [meson setup options...]
#
# The CUDA 13 headers (and nvcc, for the examples' device code) are the one thing it cannot
# install from Debian: it looks in /usr/local/cuda and says what to do when they are missing.
# tools/try.sh and .ci/run call it.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=build
BUILD=1
MESON_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) MESON_ARGS+=("$1"); shift ;;
  esac
done

# What each package is for: the build (meson, ninja, g++, Boost, fmt, tl-expected,
# nlohmann-json, toml++ for mpsshimd --config, zstd/lz4/libcrypto for the server's shared
# images), the tests (Catch2, prometheus's promtool, python3-yaml, util-linux's unshare and
# setpriv, passwd's useradd, debhelper and dpkg-dev for the package suite) and the Kubernetes
# device plugin (gRPC, protobuf).
PACKAGES=(meson ninja-build g++ pkg-config python3 binutils
  libboost-dev libfmt-dev catch2 libexpected-dev nlohmann-json3-dev prometheus
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libtomlplusplus-dev
  python3-yaml util-linux passwd libzstd-dev liblz4-dev libssl-dev debhelper dpkg-dev)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || {
    echo "setup: missing ${missing[*]}, and no apt-get to install them" >&2
    exit 1
  }
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f /usr/local/cuda/include/cuda.h ] && [[ " ${MESON_ARGS[*]-} " != *" -Ddriver_headers="* ]]; then
  echo "setup: no CUDA headers in /usr/local/cuda/include: install the CUDA 13 toolkit there" \
    "(NVIDIA's packages), or pass -Ddriver_headers=DIR" >&2
  exit 1
fi

[ "$BUILD" -eq 1 ] || exit 0
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  meson setup "$BUILD_DIR" --buildtype=debugoptimized "${MESON_ARGS[@]+"${MESON_ARGS[@]}"}"
fi
ninja -C "$BUILD_DIR"

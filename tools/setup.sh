#!/usr/bin/env bash
# One-step setup on Debian 12: installs what is missing (Debian packages only), configures and builds.
# Usage: tools/setup.sh [BUILD_DIR] [extra meson options...]   (default build dir: build)
# CUDA and NCCL are used when found under /usr/local/cuda (or $CUDA_PATH); pass -Dcuda=disabled to skip.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

packages=(g++ meson ninja-build pkg-config cmake python3 nlohmann-json3-dev doctest-dev libboost-graph-dev
          libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev zlib1g-dev librsvg2-bin
          clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda=${CUDA_PATH:-/usr/local/cuda}
if [ -x "$cuda/bin/nvcc" ]; then
  export PATH="$cuda/bin:$PATH"
  export CUDA_PATH="$cuda"
fi

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release "$@"
elif [ $# -gt 0 ]; then
  meson configure "$build" "$@"
fi
ninja -C "$build"

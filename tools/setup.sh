#!/usr/bin/env bash
# One-step setup on Debian 12: installs what is missing (Debian packages only), configures and builds.
# Usage: tools/setup.sh [BUILD_DIR] [extra meson options...]   (default build dir: build)
# CUDA and NCCL are used when found under /usr/local/cuda (or $CUDA_PATH); pass -Dcuda=disabled to skip.
# With CUDA, the header-only cudnn-frontend (PyPI's nvidia-cudnn-frontend, for the cudnn attention variant;
# cuDNN itself comes with the CUDA install) goes into the git-ignored .whl/ folder, where meson looks.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

packages=(g++ meson ninja-build pkg-config cmake python3 python3-pip nlohmann-json3-dev doctest-dev libboost-graph-dev
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
  # --target installs outside any Python environment (Debian 12's system pip refuses the others); pinned: the
  # graph API kernels/cuda/attention_cudnn.cpp is written against. A failed download leaves the variant out.
  frontend=nvidia-cudnn-frontend==1.32.0
  if [ ! -f .whl/include/cudnn_frontend.h ]; then
    echo "setup: installing $frontend into .whl/"
    python3 -m pip install -q --no-deps --disable-pip-version-check --target .whl "$frontend" ||
      echo "setup: $frontend not installed: the cudnn attention variant is left out of the build"
  fi
fi

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release "$@"
elif [ $# -gt 0 ]; then
  meson configure "$build" "$@"
fi
ninja -C "$build"

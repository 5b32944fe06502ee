#!/usr/bin/env bash
# Installs what titan.cpp needs on a fresh Debian 12 machine and builds it in Release.
#   scripts/setup.sh           system packages + the titan binary (build/titan): the quick start
#   scripts/setup.sh --tests   also the tests and benchmarks, and the Python references they
#                              compare against (.venv)
#   scripts/setup.sh --cuda    the CUDA build (-DTITAN_CUDA=ON; nvcc and the CUDA toolkit
#                              installed beforehand, no GPU needed); without it, the CPU-only build
# Safe to run again: installed packages and an up-to-date .venv are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
build_dir=build
cmake_args=()
cuda=OFF
for arg in "$@"; do
  case "$arg" in
    --tests) with_tests=1 ;;
    --sanitize) build_dir=build-sanitize; cmake_args+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTITAN_SANITIZE=ON) ;;
    --werror) cmake_args+=(-DTITAN_WERROR=ON) ;;
    --cuda) cuda=ON ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --tests, --sanitize, --werror, --cuda)" >&2; exit 2 ;;
  esac
done
if [ "$cuda" = ON ] && [ "$build_dir" = build-sanitize ]; then
  echo "setup.sh: --cuda with --sanitize: the sanitizer build is CPU-only (CUDA's runtime under AddressSanitizer: scripts/test.sh)" >&2
  exit 2
fi

packages=(
  build-essential cmake pkg-config git
  libdnnl-dev libopenblas-openmp-dev          # GEMM (oneDNN), OpenBLAS for the GEMM comparison
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libutf8proc-dev libpcre2-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libbenchmark-dev clang-format
  python3 python3-venv
  jargon-text                                 # the default training corpus (docs/DATA.md)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    # A Debian installed with a root password has no sudo.
    command -v sudo > /dev/null || { echo "setup.sh: installing ${missing[*]} needs root: run it as root, or install sudo first (as root: apt-get install sudo; adduser $(id -un) sudo)" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  echo "setup.sh: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  # Through env: sudo drops the caller's environment.
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$with_tests" -eq 1 ]; then
  # Pinned references; the stamp makes a re-run skip the (large) torch install.
  req=tests/reference/requirements.txt
  stamp=.venv/.installed-$(sha1sum "$req" | cut -c1-12)
  if [ ! -f "$stamp" ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r "$req"
    touch "$stamp"
  fi
fi

if [ "$cuda" = ON ]; then
  # cuDNN's header-only C++ frontend, a build dependency of the CUDA build alone: its wheel's
  # include/ (CMakeLists.txt finds it in .venv), without the Python packages the wheel depends on
  # (half a gigabyte the headers never use).
  req=scripts/cuda-build-requirements.txt
  stamp=.venv/.installed-cuda-$(sha1sum "$req" | cut -c1-12)
  if [ ! -f "$stamp" ]; then
    [ -x .venv/bin/pip ] || python3 -m venv .venv
    .venv/bin/pip install -q --no-deps -r "$req"
    touch "$stamp"
  fi
fi

# The quick start needs only the binary; the tests and benchmarks more than double the build.
targets=(--target titan_cli)
[ "$with_tests" -eq 1 ] && targets=()
# Said either way, so a build folder configured with CUDA before does not keep it silently.
cmake_args+=(-DTITAN_CUDA="$cuda")
cmake -S . -B "$build_dir" "${cmake_args[@]}" > /dev/null
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"

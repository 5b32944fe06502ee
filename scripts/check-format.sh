#!/usr/bin/env bash
# Every C++ and CUDA source git tracks (.cpp .h .cu .cuh .inc) is as clang-format (.clang-format at
# the root; the clang-format scripts/setup.sh installs) writes it. Prints what differs; exits 1 if
# anything does.
# usage: check-format.sh [SOURCE_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
command -v clang-format > /dev/null || { echo "check-format: clang-format is not installed" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.inc')
[ "${#files[@]}" -gt 0 ] || { echo "check-format: no sources under $root" >&2; exit 2; }
if ! clang-format --dry-run -Werror "${files[@]}"; then
  echo "check-format: run clang-format -i on the files above" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files as clang-format writes them"

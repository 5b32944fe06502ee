#!/usr/bin/env bash
# Every C++ and CUDA source is as clang-format writes it (scripts/check-format.sh), and the check
# reads CUDA: in a scratch git tree a .cu file with a kernel launch passes as clang-format writes
# it, and is refused, named, once the launch is badly spaced.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
"$src/scripts/check-format.sh" "$src"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$src/.clang-format" "$work/"
printf '__global__ void k(int* x) {\n  x[0] = 1;\n}\nvoid launch(int* x) {\n  k<<<1, 1>>>(x);\n}\n' > "$work/bad.cu"
git -C "$work" init -q && git -C "$work" add .clang-format bad.cu
"$src/scripts/check-format.sh" "$work" > /dev/null  # as clang-format writes it, launch and all
sed -i 's/k<<<1, 1>>>/k<<<1,  1>>>/' "$work/bad.cu"
if "$src/scripts/check-format.sh" "$work" 2> "$work/err"; then
  echo "a misformatted .cu passed the format check"; exit 1
fi
grep -q "bad.cu" "$work/err" || { echo "the refusal does not name bad.cu:"; cat "$work/err"; exit 1; }
echo "format: all checks passed"

#!/usr/bin/env bash
# The layer order of docs/ARCHITECTURE.md holds in the tree (scripts/check-layering.sh), and the
# check catches an include that points up: a copy of the tree with one ops file including a models
# header, and one with a directory the table does not name, are refused with the file named.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
"$src/scripts/check-layering.sh" "$src"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tree/docs" "$work/tree/scripts"
cp -r "$src/src" "$src/apps" "$work/tree/"
cp "$src/docs/ARCHITECTURE.md" "$work/tree/docs/"

sed -i '1i #include "titan/models/model_args.h"' "$work/tree/src/titan/ops/rope.cpp"
if "$src/scripts/check-layering.sh" "$work/tree" 2> "$work/up.err"; then
  echo "an ops file including models/ passed the layering check"; exit 1
fi
grep -q "src/titan/ops/rope.cpp:1: ops includes models, a layer above it" "$work/up.err" ||
  { echo "unexpected message:"; cat "$work/up.err"; exit 1; }

sed -i '1d' "$work/tree/src/titan/ops/rope.cpp"
"$src/scripts/check-layering.sh" "$work/tree" > /dev/null
mkdir "$work/tree/src/titan/extra"
if "$src/scripts/check-layering.sh" "$work/tree" 2> "$work/dir.err"; then
  echo "a directory outside the layers table passed the layering check"; exit 1
fi
grep -q "src/titan/extra/ is not a layer" "$work/dir.err" || { echo "unexpected message:"; cat "$work/dir.err"; exit 1; }
echo "layering: ok"

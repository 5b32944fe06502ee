#!/usr/bin/env bash
# The layer order of docs/ARCHITECTURE.md holds in the tree (scripts/check-layering.sh), and the
# check catches an include that points up: a copy of the tree with one ops file including a models
# header, one with an ops file and one with a train file including a backend's own header
# (backend/cpu/, backend/cuda/), and one with a directory the table does not name, are refused
# with the file named.
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

# expect_backend_folder_refused FILE HEADER: FILE including HEADER (inside one backend's folder)
# is refused with its line named; the tree passes again once the line is gone.
expect_backend_folder_refused() {
  sed -i "1i #include \"$2\"" "$work/tree/$1"
  if "$src/scripts/check-layering.sh" "$work/tree" 2> "$work/backend.err"; then
    echo "$1 including $2 passed the layering check"; exit 1
  fi
  grep -q "^$1:1 includes $2, inside one backend's folder" "$work/backend.err" ||
    { echo "unexpected message:"; cat "$work/backend.err"; exit 1; }
  sed -i '1d' "$work/tree/$1"
  "$src/scripts/check-layering.sh" "$work/tree" > /dev/null
}
expect_backend_folder_refused src/titan/ops/rope.cpp titan/backend/cpu/threads.h
expect_backend_folder_refused src/titan/train/trainer.cpp titan/backend/cuda/cuda_backend.h
# The backend layer itself and the command-line front may include a backend's folder.
grep -q '#include "titan/backend/cpu/' "$work/tree/src/titan/backend/backend.cpp"
grep -q '#include "titan/backend/cpu/' "$work/tree/apps/titan/cmd_info.cpp"

mkdir "$work/tree/src/titan/extra"
if "$src/scripts/check-layering.sh" "$work/tree" 2> "$work/dir.err"; then
  echo "a directory outside the layers table passed the layering check"; exit 1
fi
grep -q "src/titan/extra/ is not a layer" "$work/dir.err" || { echo "unexpected message:"; cat "$work/dir.err"; exit 1; }
echo "layering: ok"

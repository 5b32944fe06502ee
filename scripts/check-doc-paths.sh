#!/usr/bin/env bash
# Every source file docs/ARCHITECTURE.md names is in the tree: a path with folders (from the root,
# or under src/ or src/titan/, as the document writes them) and a bare name with a source file's
# ending (anywhere under src/, apps/, tests/, bench/ or scripts/). Names the document gives to
# files titan writes (config.json, titan.json, ...) are not source endings, so not checked.
# Prints each missing name with its line; exits 1 if there is one.
# usage: check-doc-paths.sh [ROOT [DOC]]   (DOC: another copy of the document, for the test)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
doc="${2:-$root/docs/ARCHITECTURE.md}"
[ -f "$doc" ] || { echo "check-doc-paths: $doc: no such file" >&2; exit 2; }
endings='cpp|h|cu|cuh|inc|sh|py|cmake'
# Names that are not the tree's files: the project's own name, OpenMPI's header.
not_ours=$'titan.cpp\nmpi.h'
names=$(cd "$root" && find src apps tests bench scripts -type f -printf '%f\n' | sort -u)
missing=0
while IFS=: read -r line name; do
  grep -qxF -- "$name" <<< "$not_ours" && continue
  if [[ "$name" == */* ]]; then
    [ -e "$root/$name" ] || [ -e "$root/src/$name" ] || [ -e "$root/src/titan/$name" ] && continue
  else
    grep -qxF -- "$name" <<< "$names" && continue
  fi
  echo "$doc:$line: $name is not in the tree"
  missing=1
done < <(grep -noE "(^|[^A-Za-z0-9_./-])[A-Za-z0-9][A-Za-z0-9_./-]*\.($endings)\b" "$doc" |
           sed -E 's/^([0-9]+):[^A-Za-z0-9]?/\1:/' | sort -t: -k2 -u)
exit "$missing"

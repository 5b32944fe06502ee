#!/usr/bin/env bash
# docs/ARCHITECTURE.md names only files in the tree (scripts/check-doc-paths.sh), and the check
# catches names that are not: a copy of the document naming a file by its path and one by its bare
# name, neither in the tree, is refused with each name and its line.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
"$src/scripts/check-doc-paths.sh" "$src"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
doc="$work/ARCHITECTURE.md"
cp "$src/docs/ARCHITECTURE.md" "$doc"
echo 'Fields: `src/titan/train/job_config_fields.cpp`, read by `job_config_reader.cpp`.' >> "$doc"
line=$(wc -l < "$doc")
if "$src/scripts/check-doc-paths.sh" "$src" "$doc" > "$work/out"; then
  echo "a document naming missing files passed the check"; exit 1
fi
expected="$doc:$line: job_config_reader.cpp is not in the tree
$doc:$line: src/titan/train/job_config_fields.cpp is not in the tree"
[ "$(sort "$work/out")" = "$expected" ] || { echo "unexpected report:"; cat "$work/out"; exit 1; }
echo "doc_paths: all checks passed"

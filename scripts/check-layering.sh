#!/usr/bin/env bash
# Fails when a file includes a header from a layer above its own. The layers and their order, bottom
# up, are the rows of the layers table in docs/ARCHITECTURE.md (`src/titan/<layer>/`, then apps);
# a file may include its own layer and any below it. Above the backend layer, src/titan reaches the
# hardware only through the backend-level headers (titan/backend/*.h): a file outside
# src/titan/backend/ that includes one backend's own folder (titan/backend/cpu/, .../cuda/) fails
# too (apps, tests and benchmarks may). Usage: check-layering.sh [SOURCE_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
arch="$root/docs/ARCHITECTURE.md"
[ -f "$arch" ] || { echo "check-layering: $arch not found" >&2; exit 2; }

mapfile -t layers < <(sed -n 's/^| [a-z]* | `src\/titan\/\([a-z_]*\)\/[a-z_/]*` |.*/\1/p' "$arch")
[ "${#layers[@]}" -ge 2 ] || { echo "check-layering: no layers table in $arch" >&2; exit 2; }
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done
rank[apps]=${#layers[@]}

for dir in "$root"/src/titan/*/; do
  name=$(basename "$dir")
  [ -n "${rank[$name]+set}" ] || { echo "src/titan/$name/ is not a layer in docs/ARCHITECTURE.md" >&2; exit 1; }
done

violations=0
check_tree() {  # check_tree LAYER DIR
  local layer="$1" file line target
  while IFS=: read -r file line target; do
    target="${target#*\"titan/}"
    target="${target%%/*}"
    if [ -z "${rank[$target]+set}" ]; then
      echo "${file#"$root"/}:$line includes titan/$target/, which is not a layer" >&2
      violations=$((violations + 1))
    elif [ "${rank[$target]}" -gt "${rank[$layer]}" ]; then
      echo "${file#"$root"/}:$line: $layer includes $target, a layer above it" >&2
      violations=$((violations + 1))
    fi
  done < <(grep -rnoE '#include "titan/[a-z_]+/' "$2" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.inc' || true)
}
for layer in "${layers[@]}"; do
  [ -d "$root/src/titan/$layer" ] && check_tree "$layer" "$root/src/titan/$layer"
done
check_tree apps "$root/apps"
for dir in "$root"/src/titan/*/; do
  [ "$(basename "$dir")" = backend ] && continue
  while IFS=: read -r file line target; do
    target="${target#*\"}"
    echo "${file#"$root"/}:$line includes $target, inside one backend's folder (outside src/titan/backend/, the hardware is reached through titan/backend/backend.h)" >&2
    violations=$((violations + 1))
  done < <(grep -rnoE '#include "titan/backend/[a-z_]+/[^"]*' "$dir" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.inc' || true)
done
if [ "$violations" -gt 0 ]; then
  echo "check-layering: $violations include(s) break the layering (docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check-layering: ${#layers[@]} layers, no include points up, none reaches into a backend's folder"

#!/usr/bin/env bash
# Fails when a file includes a header from a layer above its own. The layers and their order, bottom
# up, are the rows of the layers table in docs/ARCHITECTURE.md (`src/titan/<layer>/`, then apps);
# a file may include its own layer and any below it. Above the backend layer, src/titan reaches the
# hardware only through the backend-level headers (titan/backend/*.h): a file outside
# src/titan/backend/ that includes one backend's own folder (titan/backend/cpu/, .../cuda/) fails
# too (apps, tests and benchmarks may). A layer's cuda/ folder is built only into the CUDA library:
# only files in a cuda/ folder include CUDA's own headers (cuda_runtime.h, cublas*.h, ...) or
# another layer's cuda/ headers (a layer's own cuda/ header declares what its cuda/ folder defines).
# The op seam: above dispatch/, src/titan computes only through dispatched ops (the modules' bound
# kernels, dispatch/device_ops.h): a file there that calls a function an ops/ header declares, or
# the backend's vector primitives (VecKernels, backend().vec()), fails.
# Usage: check-layering.sh [SOURCE_ROOT]
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
for dir in "$root"/src/titan/*/ "$root/apps"; do
  while IFS=: read -r file line target; do
    case "$file" in */cuda/*) continue ;; esac
    # A layer's own cuda/ header (a plain C++ declaration, as backend/cuda/cuda_backend.h) is its bridge.
    layer_dir="${file#"$root"/src/titan/}"
    [[ "$target" == *\"titan/"${layer_dir%%/*}"/cuda/*.h ]] && continue
    echo "${file#"$root"/}:$line includes ${target#*\"}, which only the CUDA library's cuda/ folders may" >&2
    violations=$((violations + 1))
  done < <(grep -rnoE '#include ["<]((titan/[a-z_]+/cuda/)|cuda|cublas|cudnn|nccl|curand)[^">]*' "$dir" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.inc' || true)
done

# Every function an ops/ header declares at namespace level: "type name(" starting a line.
mapfile -t op_functions < <(sed -nE 's/^[A-Za-z_][A-Za-z0-9_:<>, *&]* \**([a-z_][a-z0-9_]*)\($/\1/p; s/^[A-Za-z_][A-Za-z0-9_:<>, *&]* \**([a-z_][a-z0-9_]*)\(.*/\1/p' "$root"/src/titan/ops/*.h | sort -u)
[ "${#op_functions[@]}" -ge 10 ] || { echo "check-layering: found only ${#op_functions[@]} functions in src/titan/ops/*.h" >&2; exit 2; }
op_pattern="(^|[^A-Za-z0-9_.>:])($(IFS='|'; echo "${op_functions[*]}"))\(|VecKernels|backend\(\)\.vec\(\)"
for layer in "${layers[@]}"; do
  [ "${rank[$layer]}" -gt "${rank[dispatch]}" ] && [ -d "$root/src/titan/$layer" ] || continue
  while IFS=: read -r file line text; do
    echo "${file#"$root"/}:$line computes past the op seam (an ops/ function or the backend's vector primitives; call a dispatched op, dispatch/device_ops.h): ${text#"${text%%[![:space:]]*}"}" >&2
    violations=$((violations + 1))
  done < <(grep -rnE "$op_pattern" "$root/src/titan/$layer" --include='*.h' --include='*.cpp' | grep -vE '^[^:]*:[0-9]+:\s*//' || true)
done

if [ "$violations" -gt 0 ]; then
  echo "check-layering: $violations include(s) break the layering (docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check-layering: ${#layers[@]} layers, no include points up, none reaches into a backend's folder or a cuda/ folder, nothing above dispatch/ calls one of the ${#op_functions[@]} ops/ functions"

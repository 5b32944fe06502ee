#!/usr/bin/env bash
# Mistakes in paths and sizes stop a run before the model is allocated and before the first step,
# with one line naming what is wrong, and change nothing on disk: a dump folder that is a file, a
# missing validation set, a config whose dims disagree with the initial weights, --config naming a
# folder, checkpoint.load_step without checkpoint.enable, an export onto the initial weights or
# onto a folder titan did not write.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"
common=(--training.steps=2 --lr_scheduler.warmup_steps=0 --training.seq_len=64
        --training.local_batch_size=2 --threads 2)

"$titan" train "${common[@]}" --checkpoint.last_save_in_hf=true --job.dump_folder="$work/run" > "$work/run.log"
echo "not a folder" > "$work/file"
cp -r "$work/run/hf" "$work/huge"
python3 - "$work/huge/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["num_hidden_layers"] = 100000
config["layer_types"] = [config["layer_types"][0]] * 100000
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
mkdir -p "$work/user/hf" && echo "mine" > "$work/user/hf/notes.txt"
tree_sum "$work" > "$work.before"
same() { tree_sum "$work" | grep -v -e "\.out$" -e "\.err$" | diff <(grep -v -e "\.out$" -e "\.err$" "$work.before") - > /dev/null \
  || { echo "$1: something changed"; exit 1; }; }
# Nothing of the run started: no step logged, nothing allocated for long.
refused() {  # NAME PATTERN ARGS...
  local name="$1" pattern="$2"
  shift 2
  expect_refusal "$name" "$pattern" timeout 30 "$titan" "$@"
  ! grep -q "^step" "$work/$name.out" || { echo "$name: training started"; exit 1; }
  same "$name"
}

refused dump_is_file "^titan train: error: job.dump_folder .*/file: is a file, not a folder$" \
  train "${common[@]}" --checkpoint.enable=true --job.dump_folder="$work/file"
refused dump_under_file "^titan train: error: job.dump_folder .*/file/run: cannot create the folder" \
  train "${common[@]}" --checkpoint.last_save_in_hf=true --job.dump_folder="$work/file/run"
refused no_validation "^titan train: error: validation.dataset_path: .*/missing.jsonl: no such file" \
  train "${common[@]}" --job.dump_folder="$work/v" --validation.enable=true --validation.dataset_path="$work/missing.jsonl"
refused config_folder "^titan train: error: .*/run: is a folder, not a TOML config file$" \
  train --config "$work/run" "${common[@]}"
refused load_step "^titan train: error: checkpoint.load_step is set but checkpoint.enable is false: set checkpoint.enable = true" \
  train "${common[@]}" --job.dump_folder="$work/run" --checkpoint.load_step=1
refused huge_layers "^titan train: error: .*/huge.*model.layers.4.input_layernorm.weight\" is missing \(and [0-9]+ more\)" \
  train "${common[@]}" --preset hf --model.hf_assets_path="$work/huge" --training.dataset=default \
  --checkpoint.initial_load_path="$work/huge" --checkpoint.initial_load_in_hf=true --job.dump_folder="$work/h"
refused huge_generate "^titan generate: error: .*/huge.*model.layers.4.input_layernorm.weight\" is missing \(and [0-9]+ more\)" \
  generate --model "$work/huge" --prompt hi --max-new-tokens 2
refused export_onto_source "^titan train: error: .*/run/hf: is checkpoint.initial_load_path .*/run/hf" \
  train "${common[@]}" --checkpoint.initial_load_path="$work/run/hf" --checkpoint.initial_load_in_hf=true \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/run"
refused export_onto_user_folder "^titan train: error: .*/user/hf: already exists and is not an empty folder, and titan did not write it" \
  train "${common[@]}" --checkpoint.last_save_in_hf=true --job.dump_folder="$work/user"
for f in "$work"/*.err; do cat "$f"; done

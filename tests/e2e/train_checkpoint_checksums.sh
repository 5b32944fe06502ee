#!/usr/bin/env bash
# Checkpoints carry a CRC-32C of every file (trainer_state.json's "checksums"), checked when a
# resume chooses one and loads it: finite garbage written into a shard's data (which the headers'
# checks and the NaN/Inf scan cannot see, and which resumed silently with a loss of 6501) makes
# that checkpoint unusable, named, and the run falls back to the older one; with none left the
# run stops in one line and changes nothing. A checkpoint without checksums (a titan from before)
# still resumes. The Hugging Face export records its files' checksums too (titan.json): a
# damaged byte in its weights is refused, naming the file, by every command that loads it
# (eval, generate, convert, a training run's initial load).
# usage: train_checkpoint_checksums.sh TITAN
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"
common=(--training.seq_len=32 --training.local_batch_size=2 --lr_scheduler.warmup_steps=0
        --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.keep_latest_k=0
        --checkpoint.last_save_model_only=false --checkpoint.last_save_in_hf=false
        --metrics.log_freq=1 --threads 1)

"$titan" train "${common[@]}" --training.steps=4 --job.dump_folder="$work/good" > /dev/null
grep -qE '"model.safetensors": "crc32c:[0-9a-f]{8}"' "$work/good/checkpoint/step-4/trainer_state.json" &&
  grep -qE '"optimizer.safetensors": "crc32c:[0-9a-f]{8}"' "$work/good/checkpoint/step-4/trainer_state.json" ||
  { echo "no checksums:"; cat "$work/good/checkpoint/step-4/trainer_state.json"; exit 1; }

# spoil FILE: 8 bytes of finite floats (1.0, 2.0) written over the middle of its data.
spoil() {
  local size
  size=$(stat -c %s "$1")
  printf '\x00\x00\x80\x3f\x00\x00\x00\x40' | dd of="$1" bs=1 seek=$((size / 2 / 4 * 4)) conv=notrunc status=none
}

# step-4's model spoiled: the resume warns naming the file and continues from step-2.
cp -r "$work/good" "$work/one"
spoil "$work/one/checkpoint/step-4/model.safetensors"
"$titan" train "${common[@]}" --training.steps=6 --job.dump_folder="$work/one" > "$work/one.log" 2> "$work/one.err"
grep -qE "^warning: checkpoint step-4 is unusable \($work/one/checkpoint/step-4/model\.safetensors: checksum mismatch \(crc32c:[0-9a-f]{8}, trainer_state\.json records crc32c:[0-9a-f]{8}\): the file was changed or damaged after the save\); using $work/one/checkpoint/step-2$" "$work/one.err" ||
  { echo "expected the fallback warning:"; cat "$work/one.err"; exit 1; }
grep -q "^resumed step 2 from $work/one/checkpoint/step-2" "$work/one.log" || { cat "$work/one.log"; exit 1; }

# Both spoiled (the optimizer file of step-2): one line, the folder unchanged.
cp -r "$work/good" "$work/both"
spoil "$work/both/checkpoint/step-4/model.safetensors"
spoil "$work/both/checkpoint/step-2/optimizer.safetensors"
tree_sum "$work/both" > "$work/both.before"
expect_refusal both "^titan train: error: $work/both/checkpoint: none of its 2 checkpoint\(s\) \(step-4, step-2\) can be resumed; step-4: $work/both/checkpoint/step-4/model\.safetensors: checksum mismatch .*checkpoint\.allow_fresh_start = true" \
  "$titan" train "${common[@]}" --training.steps=6 --job.dump_folder="$work/both"
tree_sum "$work/both" | diff "$work/both.before" - > /dev/null || { echo "the folder changed"; exit 1; }

# A checkpoint without checksums (saved before them) resumes from its headers as before.
cp -r "$work/good" "$work/old"
python3 - "$work/old/checkpoint/step-4/trainer_state.json" <<'PY'
import json, sys
state = json.load(open(sys.argv[1]))
del state["checksums"]
json.dump(state, open(sys.argv[1], "w"), indent=2)
PY
"$titan" train "${common[@]}" --training.steps=6 --job.dump_folder="$work/old" > "$work/old.log"
grep -q "^resumed step 4 from $work/old/checkpoint/step-4" "$work/old.log" || { cat "$work/old.log"; exit 1; }
# The HF export: spoiled, each loader refuses it in one line naming the file, and changes nothing.
"$titan" train "${common[@]}" --training.steps=2 --checkpoint.last_save_in_hf=true \
  --job.dump_folder="$work/export" > "$work/export.log" 2>&1 || { cat "$work/export.log"; exit 1; }
grep -qE '"model.safetensors": "crc32c:[0-9a-f]{8}"' "$work/export/hf/titan.json" ||
  { echo "no checksums in the export's marker:"; cat "$work/export/hf/titan.json"; exit 1; }
printf '{"text": "one two three four five six seven eight nine ten"}\n' > "$work/data.jsonl"
eval_args=(--data "$work/data.jsonl" --seq-len 4 --batch-size 1 --threads 1)
"$titan" eval --model "$work/export/hf" "${eval_args[@]}" > /dev/null  # loads while intact
spoil "$work/export/hf/model.safetensors"
tree_sum "$work/export" > "$work/export.before"
damaged="$work/export/hf/model\.safetensors: checksum mismatch \(crc32c:[0-9a-f]{8}, titan\.json records crc32c:[0-9a-f]{8}\): the file was changed or damaged after titan wrote it \(a folder re-saved by other tools: remove its titan\.json\)$"
expect_refusal eval "^titan eval: error: $damaged" "$titan" eval --model "$work/export/hf" "${eval_args[@]}"
expect_refusal generate "^titan generate: error: $damaged" \
  "$titan" generate --model "$work/export/hf" --prompt hi --max-new-tokens 2 --threads 1
expect_refusal convert "^titan convert: error: $damaged" "$titan" convert "$work/export/hf" "$work/converted"
expect_refusal initial_load "^titan train: error: .*$damaged" "$titan" train "${common[@]}" \
  --training.steps=1 --checkpoint.initial_load_path="$work/export/hf" --checkpoint.initial_load_in_hf=true \
  --checkpoint.initial_load_model_only=true --job.dump_folder="$work/from_export"
tree_sum "$work/export" | diff "$work/export.before" - > /dev/null || { echo "the export changed"; exit 1; }
echo "train_checkpoint_checksums: ok"

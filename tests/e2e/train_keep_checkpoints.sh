#!/usr/bin/env bash
# A resume that finds checkpoints and can use none of them stops with one line and leaves the
# folder byte-identical, whatever spoiled them: a wrong type in trainer_state.json, a truncated
# optimizer file, checkpoints of another model. checkpoint.allow_fresh_start starts over beside
# them, and pruning (keep_latest_k) then keeps the checkpoint the new run wrote, not the newer
# broken ones.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"
common=(--training.seq_len=64 --training.local_batch_size=2 --lr_scheduler.warmup_steps=0
        --model.attn_backend=blockwise --checkpoint.enable=true --checkpoint.interval=2
        --checkpoint.keep_latest_k=0 --checkpoint.last_save_model_only=false
        --checkpoint.last_save_in_hf=false --threads 2)

"$titan" train "${common[@]}" --training.steps=4 --job.dump_folder="$work/good" > "$work/good.log"
[ "$(ls "$work/good/checkpoint" | tr '\n' ' ')" = "step-2 step-4 " ] || { echo "unexpected checkpoints"; exit 1; }

refused_resume() {  # NAME: $work/NAME holds spoiled checkpoints; a resume must leave it as it is
  tree_sum "$work/$1" > "$work/$1.before"
  expect_refusal "$1" "^titan train: error: .*/checkpoint: none of its 2 checkpoint\(s\) \(step-4, step-2\) can be resumed; step-4: .*checkpoint\.allow_fresh_start = true" \
    "$titan" train "${common[@]}" --training.steps=6 --job.dump_folder="$work/$1" "${@:2}"
  tree_sum "$work/$1" | diff "$work/$1.before" - > /dev/null || { echo "$1: the folder changed"; exit 1; }
}

# A wrong type in trainer_state.json.
cp -r "$work/good" "$work/type"
for s in 2 4; do
  sed -i 's/"optimizer_step": \([0-9]*\)/"optimizer_step": "\1"/' "$work/type/checkpoint/step-$s/trainer_state.json"
done
refused_resume type
grep -q "trainer_state.json: .*type must be number" "$work/type.err" || { echo "the reason is not named"; cat "$work/type.err"; exit 1; }

# Truncated optimizer files.
cp -r "$work/good" "$work/trunc"
for s in 2 4; do
  f="$work/trunc/checkpoint/step-$s/optimizer.safetensors"
  head -c 1000 "$f" > "$work/part" && cat "$work/part" > "$f"
done
refused_resume trunc
grep -q "optimizer.safetensors" "$work/trunc.err" || { echo "the file is not named"; cat "$work/trunc.err"; exit 1; }

# Checkpoints of another model in a reused dump folder.
cp -r "$work/good" "$work/other"
refused_resume other --model.flavor=debugmodel_moe
grep -qE "tensor .* (is missing|is F32 .*, expected F32)" "$work/other.err" || { echo "the mismatch is not named"; cat "$work/other.err"; exit 1; }

# checkpoint.allow_fresh_start: a new run from step 1 beside the broken step-2 and step-4; with
# keep_latest_k = 1 it keeps the step-2 it wrote (the broken step-4 is newer: never pruned).
"$titan" train "${common[@]}" --training.steps=2 --job.dump_folder="$work/type" \
  --checkpoint.allow_fresh_start=true --checkpoint.keep_latest_k=1 > "$work/fresh.log" 2> "$work/fresh.err"
grep -q "^model weights: random init" "$work/fresh.log" || { echo "no fresh start"; cat "$work/fresh.log"; exit 1; }
grep -q "checkpoint.allow_fresh_start" "$work/fresh.err" || { echo "no warning"; cat "$work/fresh.err"; exit 1; }
[ "$(ls "$work/type/checkpoint" | tr '\n' ' ')" = "step-2 step-4 " ] || { echo "pruning removed: $(ls "$work/type/checkpoint")"; exit 1; }
cmp -s "$work/type.before" <(tree_sum "$work/type") && { echo "step-2 was not rewritten"; exit 1; }
"$titan" train "${common[@]}" --training.steps=2 --job.dump_folder="$work/type" --checkpoint.load_step=2 > "$work/load2.log"
grep -q "resumed step 2 from" "$work/load2.log" || { echo "the new step-2 does not load"; exit 1; }
echo "refused: $(cat "$work/type.err")"

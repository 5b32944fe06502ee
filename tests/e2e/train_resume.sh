#!/usr/bin/env bash
# A resumed run's losses equal the uninterrupted run's, bit for bit: train 6 steps saving every 2,
# drop the last two checkpoints, train again (it resumes from step 2), compare steps 3-6.
# Then a checkpoint damaged on disk is skipped for the previous one, and says so.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--training.steps=6 --lr_scheduler.warmup_steps=2 --training.seq_len=64 --training.local_batch_size=2
        --model.attn_backend=blockwise --metrics.log_freq=1 --checkpoint.enable=true
        --checkpoint.interval=2 --checkpoint.keep_latest_k=0 --checkpoint.last_save_in_hf=false
        --job.dump_folder="$work/run" --threads 2)

"$titan" train "${common[@]}" --metrics.save_jsonl="$work/full.jsonl" > "$work/full.log"
ls "$work/run/checkpoint" | sort > "$work/steps"
[ "$(tr '\n' ' ' < "$work/steps")" = "step-2 step-4 step-6 " ] || { echo "unexpected checkpoints: $(cat "$work/steps")"; exit 1; }

rm -rf "$work/run/checkpoint/step-4" "$work/run/checkpoint/step-6"
"$titan" train "${common[@]}" --metrics.save_jsonl="$work/resumed.jsonl" > "$work/resumed.log"
grep -q "resumed step 2 from" "$work/resumed.log" || { echo "did not resume from step 2"; cat "$work/resumed.log"; exit 1; }

# Losses of steps 3..6, printed with every digit the JSON holds.
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["step"] >= 3: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"; }
diff <(losses "$work/full.jsonl") <(losses "$work/resumed.jsonl") || { echo "resumed losses differ"; exit 1; }
[ "$(losses "$work/full.jsonl" | wc -l)" = 4 ] || { echo "expected 4 compared steps"; exit 1; }

# A damaged newest checkpoint: the run falls back to the one before and says which.
head -c 100 "$work/run/checkpoint/step-6/model.safetensors" > "$work/trunc"
mv "$work/trunc" "$work/run/checkpoint/step-6/model.safetensors"
"$titan" train "${common[@]}" --training.steps=6 > "$work/fallback.log" 2> "$work/fallback.err"
grep -q "checkpoint step-6 is unusable" "$work/fallback.err" || { echo "no fallback warning"; cat "$work/fallback.err"; exit 1; }
grep -q "resumed step 4 from" "$work/fallback.log" || { echo "did not fall back to step 4"; exit 1; }
echo "resume: steps 3-6 identical; damaged step-6 skipped for step-4"

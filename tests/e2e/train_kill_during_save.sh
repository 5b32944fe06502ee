#!/usr/bin/env bash
# Killing the trainer at any moment -- often in the middle of writing a checkpoint, since it saves
# after every step -- leaves every step-N folder complete: each restart resumes from the newest
# one without a warning, and no temporary folder is mistaken for a checkpoint.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--training.steps=400 --training.seq_len=64 --training.local_batch_size=2
      --lr_scheduler.warmup_steps=2 --checkpoint.enable=true --checkpoint.interval=1
      --checkpoint.keep_latest_k=3 --checkpoint.last_save_in_hf=false --metrics.log_freq=1000
      --job.dump_folder="$work/run" --threads 1)
# Two complete steps first, so there is always a checkpoint to resume from however slow start-up
# is (sanitizer builds); then the kills.
"$titan" train "${args[@]}" --training.steps=2 > "$work/log.0" 2> "$work/err.0"
RANDOM=7
for round in 1 2 3 4 5 6 7 8; do
  "$titan" train "${args[@]}" > "$work/log.$round" 2> "$work/err.$round" &
  pid=$!
  sleep "$(printf '%d.%02d' $((2 + RANDOM % 2)) $((RANDOM % 100)))"  # start-up takes about 1 s
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if grep -q "unusable" "$work/err.$round"; then
    echo "round $round: a checkpoint left by the previous kill was unusable:"; cat "$work/err.$round"; exit 1
  fi
done
# The newest checkpoint loads cleanly (no further steps are run: steps = that step).
newest=$(ls "$work/run/checkpoint" 2> /dev/null | grep -E '^step-[0-9]+$' | sed 's/step-//' | sort -n | tail -1 || true)
[ -n "$newest" ] || { echo "no checkpoint was ever completed"; exit 1; }
"$titan" train "${args[@]}" --training.steps="$newest" > "$work/final.log" 2> "$work/final.err"
grep -q "resumed step $newest from" "$work/final.log" || { echo "step-$newest did not load"; cat "$work/final.err"; exit 1; }
! grep -q "unusable" "$work/final.err" || { echo "a checkpoint was unusable"; cat "$work/final.err"; exit 1; }
echo "8 kills; newest checkpoint step-$newest loads; $(ls "$work/run/checkpoint" | wc -l) entries in the folder"

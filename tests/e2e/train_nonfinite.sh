#!/usr/bin/env bash
# A run whose gradients turn non-finite (a learning rate of 1e30 blows the weights up after one
# step) stops with one line naming the step and the first non-finite parameter; with
# training.skip_nonfinite_steps it skips those steps, says so, and finishes.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--optimizer.lr=1e30 --training.steps=4 --lr_scheduler.warmup_steps=0 --training.seq_len=64
      --checkpoint.last_save_in_hf=false --job.dump_folder="$work/run" --threads 2)
if "$titan" train "${args[@]}" > "$work/stop.log" 2> "$work/stop.err"; then
  echo "the run did not stop"; exit 1
fi
[ "$(wc -l < "$work/stop.err")" = 1 ] || { echo "expected one error line:"; cat "$work/stop.err"; exit 1; }
grep -qE "^titan train: error: step [0-9]+: non-finite gradient in model\." "$work/stop.err" \
  || { echo "unexpected error:"; cat "$work/stop.err"; exit 1; }
"$titan" train "${args[@]}" --training.skip_nonfinite_steps=true > "$work/skip.log" 2> "$work/skip.err"
grep -q "skipped: non-finite gradient" "$work/skip.err" || { echo "no skip warning"; cat "$work/skip.err"; exit 1; }
grep -q "^summary:" "$work/skip.log" || { echo "the skipping run did not finish"; exit 1; }
echo "stopped: $(cat "$work/stop.err")"

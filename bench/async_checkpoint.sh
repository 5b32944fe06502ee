#!/usr/bin/env bash
# The step time of a checkpoint save step, synchronous against checkpoint.async_mode = "async"
# (issue 44): `titan train` on bench_train_step's `small` dims (h 512, 8 layers, 8/4 heads, hd 128,
# I 2048, V 151936 tied; 115.5 M parameters: a full checkpoint holds 1.39 GB of tensors), fp32,
# --steps steps saving every --interval, once synchronously and once asynchronously, one after the
# other in the same run.
#
#   bench/async_checkpoint.sh [--steps 7] [--interval 3] [--threads 2] [--batch 4] [--seq 512]
#
# Every stdout line of the trainer is time-stamped as it arrives (the step and checkpoint lines are
# flushed when printed). The time from step N's line to step N+1's is step N+1's compute plus
# whatever ran between them: the save of step N when N is a save step. Printed per run: a normal
# step (the mean of the intervals after warm-up and before the first save), and for every full
# save (the first allocates the staging copy, later ones reuse it) its step's interval and excess
# over a normal step, the stall the trainer reports (sync: the whole write; async: the staging
# copy, after waiting for the save before), the step after it (it shares the cores with the
# background write) and the save's line. The model folder (config.json and the
# built-in debug tokenizer, whose 2048 ids cost the same as any in the 151,936-row embedding) is
# made in a temporary folder; the logs stay in $TITAN_BENCH_LOGS (default: a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
me=async_checkpoint.sh
. bench/small_model.sh

steps=7 interval=3 threads=2 batch=4 seq=512
parse_options "--steps N, --interval N, --threads N, --batch N, --seq N" "$@"
positive_integers "$steps" "$interval" "$threads" "$batch" "$seq"
[ "$interval" -ge 3 ] && [ "$steps" -gt "$interval" ] ||
  die "--interval $interval, --steps $steps: a normal step after warm-up needs interval >= 3, and a step after the save steps > interval"
small_model_workspace

config=(--model.flavor=hf --model.hf_assets_path="$work/small" --training.steps="$steps"
        --training.seq_len="$seq" --training.local_batch_size="$batch" --lr_scheduler.warmup_steps=1
        --checkpoint.enable=true --checkpoint.interval="$interval" --checkpoint.keep_latest_k=0
        --checkpoint.last_save_in_hf=false --metrics.log_freq=1 --threads "$threads")
stamp() { python3 -u -c 'import sys, time
for line in sys.stdin: print(f"{time.monotonic():.3f} {line}", end="")'; }
echo "$me: load before: $(load_average)"
for mode in disabled async; do
  "$titan" train "${config[@]}" --checkpoint.async_mode="$mode" --job.dump_folder="$work/$mode" \
    2> "$logs/$mode.err" | stamp > "$logs/$mode.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { cat "$logs/$mode.err"; die "the $mode run failed"; }
  rm -rf "${work:?}/$mode"
done
echo "$me: load after: $(load_average)"

# report MODE: per full save (every --interval steps before the last), the interval from its step
# line to the next against a normal step, the stall the trainer reports, and the save's line.
report() {
  awk -v mode="$1" -v interval="$interval" -v steps="$steps" '
    $2 == "step" { split($3, s, "/"); at[s[1] + 0] = $1 }
    $2 == "checkpoint" && $3 == "saved:" { n = split($4, p, "step-"); saved[p[n] + 0] = $0 }
    $2 == "checkpoint" && $4 == "state" { n = split($3, p, "step-"); stall[p[n] + 0] = $7 }
    END {
      n = 0; sum = 0
      for (k = 2; k < interval; ++k) { sum += at[k + 1] - at[k]; n += 1 }
      normal = sum / n
      printf "%-8s normal step %.3f s (the mean of steps 3 to %d)\n", mode, normal, interval
      for (k = interval; k < steps; k += interval) {
        save = at[k + 1] - at[k]
        printf "         save step %d: %.3f s (+%.3f s)", k, save, save - normal
        if (k in stall) printf ", staging stall %s s", stall[k]
        if (k + 2 <= steps) printf ", the step after: %.3f s", at[k + 2] - at[k + 1]
        line = saved[k]; sub(/^[0-9.]+ /, "", line); printf "\n           %s\n", line
      }
    }' "$logs/$1.log"
}
report disabled
report async
echo "logs: $logs"

#!/usr/bin/env bash
# Activation checkpointing modes against each other: `titan train` on bench_train_step's `small`
# dims (h 512, 8 layers, 8/4 heads, hd 128, I 2048, V 151936 tied; 115.5 M parameters), the same
# config and batch under activation_checkpoint.mode none, full, selective "op" and selective "2",
# one after another. Prints per mode the median step time of the steps after the first (warm-up;
# the machine is shared, so the median of several), the run's step peak and its activations (the
# trainer's accounted memory, metrics JSONL), `titan plan`'s activations for the same flags, and
# whether the losses equal none's.
#
#   bench/activation_checkpointing.sh [--steps 5] [--threads 2] [--batch 2] [--seq 512] [--dtype float32]
#
# The model folder (config.json and the built-in debug tokenizer, whose 2048 ids cost the same as
# any in the 151,936-row embedding) is made in a temporary folder; the logs stay in
# $TITAN_BENCH_LOGS (default: a temporary folder, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
me=activation_checkpointing.sh
. bench/small_model.sh

steps=5 threads=2 batch=2 seq=512 dtype=float32
parse_options "--steps N, --threads N, --batch N, --seq N, --dtype float32|bfloat16" "$@"
positive_integers "$steps" "$threads" "$batch" "$seq"
[ "$dtype" = float32 ] || [ "$dtype" = bfloat16 ] || die "--dtype $dtype: expected float32 or bfloat16"
[ "$steps" -ge 2 ] || die "--steps $steps: the first step is warm-up, at least 2 are needed"
small_model_workspace

config=(--model.flavor=hf --model.hf_assets_path="$work/small" --training.steps="$steps"
        --training.seq_len="$seq" --training.local_batch_size="$batch" --threads "$threads"
        --training.mixed_precision_param="$dtype" --lr_scheduler.warmup_steps=1
        --checkpoint.last_save_in_hf=false --metrics.log_freq=1)
modes=("none" "full" "selective op" "selective 2")
echo "$me: load before: $(load_average)"
for mode in "${modes[@]}"; do
  read -r ac option <<< "$mode"
  name="$ac${option:+-$option}"
  flags=("${config[@]}" --activation_checkpoint.mode="$ac")
  [ -n "$option" ] && flags+=(--activation_checkpoint.selective_ac_option="$option")
  "$titan" plan "${flags[@]}" --json > "$logs/$name.plan"
  "$titan" train "${flags[@]}" --job.dump_folder="$work/$name" \
    --metrics.save_jsonl="$logs/$name.jsonl" > "$logs/$name.log" 2>&1 \
    || { cat "$logs/$name.log"; die "$mode failed"; }
done
echo "$me: load after: $(load_average)"

python3 - "$logs" "$batch" "$seq" "$dtype" <<'PY'
import json, statistics, sys
logs, batch, seq, dtype = sys.argv[1:]
GiB = 2**30
names = [("none", "none"), ("full", "full"), ("selective-op", 'selective "op"'),
         ("selective-2", 'selective "2"')]
def records(name):
    return [json.loads(l) for l in open(f"{logs}/{name}.jsonl") if '"loss"' in l]
losses = [r["loss"] for r in records("none")]
base = None
print(f"| mode ({batch} x {seq} tokens, {dtype}) | step time, median (steps 2-{len(losses)}) | step peak | activations (run / plan) | losses = none's |")
print("|---|---|---|---|---|")
for name, label in names:
    rs = records(name)
    times = [r["step_time_s"] for r in rs[1:]]
    median = statistics.median(times)
    base = base or median
    peak = rs[-1]["memory_peak_gib"]
    act = rs[-1]["memory_peak_by_category_gib"]["activations"] * GiB
    planned = json.load(open(f"{logs}/{name}.plan"))["memory_bytes"]["step_by_category"]["activations"]
    same = [r["loss"] for r in rs] == losses
    print(f"| {label} | {median:.2f} s ({median / base:.2f}x; {min(times):.2f}-{max(times):.2f}) "
          f"| {peak:.3f} GiB | {act / GiB:.3f} / {planned / GiB:.3f} GiB | {'yes' if same else 'NO'} |")
PY
echo "logs: $logs"

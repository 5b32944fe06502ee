#!/usr/bin/env bash
# LoRA against full fine-tuning (issue 43's bar: LoRA's step peak memory at most 0.5x and its step
# time at most 0.8x full fine-tuning's): `titan train` on bench_train_step's `small` dims (h 512,
# 8 layers, 8/4 heads, hd 128, I 2048, V 151936 tied; 115.5 M parameters) in fp32, full
# fine-tuning and LoRA (rank 8, alpha 16 on all seven projections) in alternating pairs, the same
# config and batch. Prints each run's step peak (the trainer's accounted memory) and mean step time
# after the first (warm-up), and the ratios LoRA / full of the pairs' means.
#
#   bench/lora_vs_full.sh [--pairs 2] [--steps 4] [--threads 2] [--batch 4] [--seq 512] [--ac none]
#                         [--precision float32] [--base-dtype float32] [--nproc 1]
#
# --ac: activation_checkpoint.mode of both (none or full); --precision:
# training.mixed_precision_param of both (float32 or bfloat16); --base-dtype: the LoRA runs'
# lora.base_dtype (bfloat16 needs --precision bfloat16: the frozen base held only in bf16). With
# bfloat16 the base is loaded from a Hugging Face folder (its weights made first by one step of
# full fine-tuning), and both runs of each pair load it. --nproc N > 1: every run under FSDP over N
# ranks (titan launch, data_parallel_shard_degree N, --threads per rank; --batch per rank), the
# peak the maximum over the ranks.
# The model folder (config.json and the built-in debug tokenizer, whose 2048 ids cost the same as
# any in the 151,936-row embedding) is made in a temporary folder; the logs stay in
# $TITAN_BENCH_LOGS (default: a temporary folder, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
me=lora_vs_full.sh
. bench/small_model.sh

pairs=2 steps=4 threads=2 batch=4 seq=512 ac=none precision=float32 base_dtype=float32 nproc=1
parse_options "--pairs N, --steps N, --threads N, --batch N, --seq N, --ac none|full, --precision float32|bfloat16, --base-dtype float32|bfloat16, --nproc N" "$@"
positive_integers "$pairs" "$steps" "$threads" "$batch" "$seq" "$nproc"
[ "$ac" = none ] || [ "$ac" = full ] || die "--ac $ac: expected none or full"
[ "$precision" = float32 ] || [ "$precision" = bfloat16 ] ||
  die "--precision $precision: expected float32 or bfloat16"
[ "$base_dtype" = float32 ] || [ "$base_dtype" = bfloat16 ] ||
  die "--base-dtype $base_dtype: expected float32 or bfloat16"
[ "$base_dtype" = float32 ] || [ "$precision" = bfloat16 ] ||
  die "--base-dtype bfloat16 needs --precision bfloat16"
[ "$steps" -ge 2 ] || die "--steps $steps: the first step is warm-up, at least 2 are needed"
small_model_workspace

model=(--model.flavor=hf --model.hf_assets_path="$work/small" --training.seq_len="$seq"
       --training.local_batch_size="$batch" --threads "$threads" --lr_scheduler.warmup_steps=1
       --metrics.log_freq=1 --activation_checkpoint.mode="$ac"
       --training.mixed_precision_param="$precision")
config=("${model[@]}" --training.steps="$steps" --checkpoint.last_save_in_hf=false)
train=("$titan" train)
if [ "$nproc" -gt 1 ]; then
  train=("$titan" launch --nproc "$nproc" train)
  config+=(--parallelism.data_parallel_shard_degree="$nproc"
           --training.global_batch_size=$((batch * nproc)))
fi
lora=(--lora.rank=8 --lora.alpha=16 --lora.base_dtype="$base_dtype")
if [ "$base_dtype" = bfloat16 ]; then
  # A bf16 base is loaded, never initialised: weights for it, and the same load for full
  # fine-tuning.
  "$titan" train "${model[@]}" --training.steps=1 --checkpoint.last_save_in_hf=true \
    --job.dump_folder="$work/weights" > "$logs/weights.log" 2>&1 ||
    { cat "$logs/weights.log"; die "making the base's weights failed"; }
  config+=(--checkpoint.initial_load_path="$work/weights/hf" --checkpoint.initial_load_in_hf=true)
fi
echo "$me: load before: $(load_average)"
for pair in $(seq "$pairs"); do
  "${train[@]}" "${config[@]}" --job.dump_folder="$work/full$pair" > "$logs/full$pair.log" 2>&1 \
    || { cat "$logs/full$pair.log"; die "full fine-tuning failed"; }
  "${train[@]}" "${config[@]}" "${lora[@]}" --job.dump_folder="$work/lora$pair" \
    > "$logs/lora$pair.log" 2>&1 || { cat "$logs/lora$pair.log"; die "LoRA failed"; }
done
echo "$me: load after: $(load_average)"

# The mean time of the steps after the first, and the summary's peak memory (GiB).
step_time() { awk '/^step /{ for (i = 1; i < NF; ++i) if ($i == "time") { t = $(i + 1); sub("s", "", t) }
  if ($2 > 1) { sum += t; n += 1 } } END { printf "%.3f", sum / n }' "$1"; }
peak() { sed -n 's/.*peak memory \([0-9.]*\) GiB.*/\1/p' "$1"; }
for kind in full lora; do
  for pair in $(seq "$pairs"); do
    echo "$kind run $pair: step $(step_time "$logs/$kind$pair.log") s, peak $(peak "$logs/$kind$pair.log") GiB" \
      "($(sed -n 's/.*peak memory [0-9.]* GiB (\([^)]*\)).*/\1/p' "$logs/$kind$pair.log"))"
  done
done
mean() { for pair in $(seq "$pairs"); do echo "$("$1" "$logs/$2$pair.log")"; done | awk '{ s += $1 } END { printf "%.4f", s / NR }'; }
awk -v ft="$(mean step_time full)" -v lt="$(mean step_time lora)" -v fp="$(mean peak full)" \
  -v lp="$(mean peak lora)" 'BEGIN { printf "LoRA / full: step time %.3f / %.3f s = %.2fx; peak memory %.2f / %.2f GiB = %.2fx\n", lt, ft, lt / ft, lp, fp, lp / fp }'
echo "logs: $logs"

#!/usr/bin/env bash
# FSDP's collectives against compute (issue 15): `titan train` on bench_train_step's `small` dims
# (h 512, 8 layers, 8/4 heads, hd 128, I 2048, V 151936 tied; 115.5 M parameters) in fp32, once
# on 2 ranks with FSDP (`titan launch --nproc 2`: mpirun -np 2 --bind-to none) and once as one process, the same
# config and global batch, one after the other in the same run. Prints, per step after the first
# (warm-up), FSDP 2's time in collectives on the communication thread, the part the compute thread
# waited for (exposed), the share hidden (1 - exposed / total), and both runs' tokens/s.
#
#   bench/fsdp_overlap.sh [--steps 4] [--threads 2] [--batch 4] [--seq 512]
#
# --threads is the machine's: each of the 2 ranks gets half (as `titan launch` gives them), the
# single process all of it. Each rank also runs its communication thread (distributed/comm_stream.h). The model folder (config.json and the built-in debug tokenizer, whose
# 2048 ids cost the same as any in the 151,936-row embedding) is made in a temporary folder; both
# runs' logs stay in $TITAN_BENCH_LOGS (default: a temporary folder, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
me=fsdp_overlap.sh
. bench/small_model.sh

steps=4 threads=2 batch=4 seq=512
parse_options "--steps N, --threads N, --batch N, --seq N" "$@"
positive_integers "$steps" "$threads" "$batch" "$seq"
[ "$steps" -ge 2 ] || die "--steps $steps: the first step is warm-up, at least 2 are needed"
[ "$threads" -ge 2 ] || die "--threads $threads: two ranks need at least 2"
small_model_workspace

# One micro-batch of --batch sequences per rank and step; the single process runs both.
config=(--model.flavor=hf --model.hf_assets_path="$work/small" --training.steps="$steps"
        --training.seq_len="$seq" --training.local_batch_size="$batch"
        --training.global_batch_size=$((2 * batch)) --lr_scheduler.warmup_steps=1
        --checkpoint.last_save_in_hf=false --metrics.log_freq=1)
echo "$me: load before: $(load_average)"
"$titan" launch --nproc 2 train "${config[@]}" --threads $((threads / 2)) \
  --job.dump_folder="$work/fsdp2" > "$logs/fsdp2.log" 2>&1 || { cat "$logs/fsdp2.log"; die "FSDP 2 failed"; }
"$titan" train "${config[@]}" --threads "$threads" --job.dump_folder="$work/single" \
  > "$logs/single.log" 2>&1 || { cat "$logs/single.log"; die "the single process failed"; }
echo "$me: load after: $(load_average)"

# tokens/s of the steps after the first, from the step lines (tokens of the global batch / time).
tps() { awk -v tokens=$((2 * batch * seq)) '/^step /{ for (i = 1; i < NF; ++i) if ($i == "time") { t = $(i + 1); sub("s", "", t) }
  if ($2 > 1) { sum += t; n += 1 } } END { printf "%.0f %.3f", tokens * n / sum, sum / n }' "$1"; }
read -r fsdp_tps fsdp_step <<< "$(tps "$logs/fsdp2.log")"
read -r single_tps single_step <<< "$(tps "$logs/single.log")"
line=$(grep '^collectives:' "$logs/fsdp2.log") || die "no collectives line in $logs/fsdp2.log"
echo "FSDP 2 $line"
grep '^step ' "$logs/fsdp2.log" | awk '{print "  fsdp2 " $0}'
grep '^step ' "$logs/single.log" | awk '{print "  single " $0}'
printf "tokens/s (steps 2-%d): FSDP 2 %s (%.3f s/step), one process %s (%.3f s/step): %.2fx\n" \
  "$steps" "$fsdp_tps" "$fsdp_step" "$single_tps" "$single_step" "$(echo "$fsdp_tps / $single_tps" | bc -l)"
echo "logs: $logs"

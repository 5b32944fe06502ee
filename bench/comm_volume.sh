#!/usr/bin/env bash
# Communication volume per step against `titan plan`'s analytic figures (issue 42): `titan train`
# on bench_train_step's `small` dims (h 512, 8 layers, 8/4 heads of 128, I 2048, V 151936 tied;
# 115.5 M parameters) in fp32 on 2 ranks (`titan launch --nproc 2`), TP 2 with sequence parallel,
# TP 2 without, and FSDP 2, one after the other. For each it prints, per (group, collective), the
# calls and bytes per step the ranks' communicators counted inside the steps after the first
# (rank 0's: train/comm_report.h) beside what `titan plan --nproc 2` predicts for the same flags
# (they must be equal: the script fails otherwise), and the trainer's `collectives:` line: the
# seconds per step the communication thread spent in collectives, the part the compute thread
# waited for them while they ran (exposed), the share hidden behind compute (1 - exposed / busy),
# the rest of its waits (the hand-offs between the threads) and its whole wait as a share of the
# step time.
# Then EP 2 on `small`'s MoE sibling (the same attention, vocabulary and 8 layers, every MLP 8
# experts of width 512, top-2): its all-to-all-v's calls must equal the plan's, their bytes follow
# the routing and are printed beside the plan's expectation under uniform routing.
#
#   bench/comm_volume.sh [--steps 3] [--threads 2] [--batch 2] [--seq 512]
#
# --threads is the machine's: each rank gets half (as `titan launch` gives them). Logs stay in
# $TITAN_BENCH_LOGS (default: a temporary folder, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
me=comm_volume.sh
. bench/small_model.sh

steps=3 threads=2 batch=2 seq=512
parse_options "--steps N, --threads N, --batch N, --seq N" "$@"
positive_integers "$steps" "$threads" "$batch" "$seq"
[ "$steps" -ge 2 ] || die "--steps $steps: the first step is warm-up, at least 2 are needed"
[ "$threads" -ge 2 ] || die "--threads $threads: two ranks need at least 2"
small_model_workspace
mkdir "$work/small_moe"
cp "$work/small"/tokenizer*.json "$work/small_moe/"
sed -e 's/"Qwen3ForCausalLM"/"Qwen3MoeForCausalLM"/' -e 's/"qwen3"/"qwen3_moe"/' \
    -e 's/"intermediate_size": 2048,/"intermediate_size": 2048, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512, "norm_topk_prob": true,/' \
    "$work/small/config.json" > "$work/small_moe/config.json"
python=.venv/bin/python
[ -x "$python" ] || python=python3

config=(--model.flavor=hf --model.hf_assets_path="$work/small" --training.steps="$steps"
        --training.seq_len="$seq" --training.local_batch_size="$batch"
        --training.global_batch_size=$((2 * batch)) --lr_scheduler.warmup_steps=1
        --checkpoint.last_save_in_hf=false --metrics.log_freq=1 --threads $((threads / 2)))

# run NAME ARGS... [-- COMPARE_OPTIONS...]: plan and train on 2 ranks, the measured table beside
# the plan's
run() {
  local name="$1" compare=()
  shift
  local args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -eq 0 ] || { shift; compare=("$@"); }
  set -- "${args[@]}"
  build/titan plan --json --nproc 2 "${config[@]}" "$@" > "$logs/$name.plan.json" 2> "$logs/$name.plan.err" ||
    { cat "$logs/$name.plan.err"; die "$name: titan plan failed"; }
  build/titan launch --nproc 2 train "${config[@]}" "$@" --job.dump_folder="$work/$name" \
    > "$logs/$name.log" 2>&1 || { cat "$logs/$name.log"; die "$name failed"; }
  echo "$name (measured per step on rank 0 after warm-up, against titan plan):"
  "$python" tests/e2e/comm_compare.py "$logs/$name.plan.json" "$logs/$name.log" "${compare[@]}" ||
    die "$name: the measured communication differs from titan plan's"
  echo "  $(grep '^collectives:' "$logs/$name.log")"
  grep '^step ' "$logs/$name.log" | tail -1 | sed 's/^/  last /'
}

echo "$me: load before: $(load_average)"
run tp2_sp --parallelism.tensor_parallel_degree=2
run tp2 --parallelism.tensor_parallel_degree=2 --parallelism.enable_sequence_parallel=false
run fsdp2
run ep2 --model.hf_assets_path="$work/small_moe" --parallelism.expert_parallel_degree=2 \
  -- --expectation ep/all_to_all_v
echo "$me: load after: $(load_average)"
echo "logs: $logs"

#!/usr/bin/env bash
# The communicators' counts (distributed/comm_counts.h) against `titan plan`'s communication table:
# `titan train` on 2 ranks (tiny Qwen3, fp32, 3 steps of 2 micro-batches per rank) reports what
# each group's collectives moved per step after warm-up, and every (group, collective)'s calls and
# bytes must equal the plan's for the same flags exactly -- DDP 2, FSDP 2 (full activation
# checkpointing too; bf16 on the tiny MoE: bf16 gathers), TP 2 with sequence parallel and without
# (with full activation checkpointing: the recompute's collectives), and on 4 ranks HSDP 2 x 2 and
# FSDP 2 x TP 2; EP 2, DDP 2 x EP 2, FSDP 2 x EP 2 and on 8 ranks HSDP 2 x FSDP 2 x EP 2 on the
# tiny MoE, and EP x TP there: TP 2 x EP 2 (the load-balancing loss on; and without sequence
# parallel under full activation checkpointing), FSDP 2 x TP 2 x EP 2, TP 2 x EP 4, DDP 2 x TP 2 x
# EP 2 (the load-balancing loss on: the statistics over "tp", then "dp"), and TP without EP:
# TP 2 (the load-balancing loss on; without sequence parallel under full activation
# checkpointing) and FSDP 2 x TP 2 (the load-balancing loss on) (expert
# parallel's all-to-all-v: its calls exact, its bytes an expectation under uniform routing,
# printed beside; DDP 2 x EP 2 with the global load-balancing loss: its router
# statistics' all-reduce per micro-batch over dp; under FSDP x EP the experts' all-gathers and
# reduce-scatters over "expert_shard" beside the shard group's, exact). A mismatched pair is
# caught. Also the one-process plan has no table and its run no report.
# usage: comm_counts.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/mpi_env.sh"
compare="$(dirname "$0")/comm_compare.py"

common=(--training.steps=3 --training.seq_len=64 --training.local_batch_size=1
        --training.global_batch_size=4 --lr_scheduler.warmup_steps=1 --threads 1)

# check NAME NPROC ARGS...: plan and train on NPROC ranks with ARGS, the counts compared
# (comm_compare.py's options in compare_options)
compare_options=()
check() {
  local name="$1" n="$2"
  shift 2
  "$titan" plan --json --nproc "$n" "${common[@]}" "$@" > "$work/$name.plan.json" 2> "$work/$name.plan.err" ||
    { cat "$work/$name.plan.err"; exit 1; }
  "$titan" launch --nproc "$n" train "${common[@]}" "$@" --job.dump_folder="$work/$name" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; exit 1; }
  echo "$name:"
  "$python" "$compare" "$work/$name.plan.json" "$work/$name.log" "${compare_options[@]}" ||
    { echo "$name: the measured communication differs from titan plan's"; cat "$work/$name.log"; exit 1; }
}

tp2=(--parallelism.tensor_parallel_degree=2)
check ddp2 2 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1
check fsdp2 2
check fsdp2_full_ac 2 --activation_checkpoint.mode=full
check fsdp2_bf16_moe 2 --model.flavor=tiny_moe --training.mixed_precision_param=bfloat16
check tp2_sp 2 "${tp2[@]}"
check tp2 2 "${tp2[@]}" --parallelism.enable_sequence_parallel=false
check tp2_full_ac 2 "${tp2[@]}" --activation_checkpoint.mode=full
check hsdp2x2 4 --parallelism.data_parallel_replicate_degree=2
check fsdp2_tp2 4 "${tp2[@]}"
ep2=(--model.flavor=tiny_moe --parallelism.expert_parallel_degree=2)
compare_options=(--expectation ep/all_to_all_v)
check ep2 2 "${ep2[@]}"
check ddp2_ep2_aux 4 "${ep2[@]}" --parallelism.data_parallel_replicate_degree=2 --model.output_router_logits=true
check fsdp2_ep2 4 "${ep2[@]}"
grep -q "^  expert_shard  *all_gather" "$work/fsdp2_ep2.log" ||
  { echo "fsdp2_ep2: no expert_shard all-gathers measured"; cat "$work/fsdp2_ep2.log"; exit 1; }
check hsdp2_fsdp2_ep2 8 "${ep2[@]}" --parallelism.data_parallel_replicate_degree=2 --training.global_batch_size=8
# EP x TP: the sparse blocks on the sequence shards (all-to-all-v's of tokens / tp), the routers'
# gradients and (with the load-balancing loss) their statistics summed over TP, without sequence
# parallel the sparse blocks' output and input-gradient all-gathers.
check tp2_ep2_aux 2 "${ep2[@]}" "${tp2[@]}" --model.output_router_logits=true
check tp2_ep2_nosp_full_ac 2 "${ep2[@]}" "${tp2[@]}" --parallelism.enable_sequence_parallel=false \
  --activation_checkpoint.mode=full
check fsdp2_tp2_ep2 4 "${ep2[@]}" "${tp2[@]}"
check tp2_ep4 4 --model.flavor=tiny_moe "${tp2[@]}" --parallelism.expert_parallel_degree=4
check ddp2_tp2_ep2_aux 4 "${ep2[@]}" "${tp2[@]}" --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=1 --model.output_router_logits=true
compare_options=()
# TP without EP on the MoE (expert tensor parallel): each sparse block a TP block like a dense MLP
# (SP's gathers and reduce-scatters, or all-reduces), the routers' gradients summed over TP, the
# load-balancing statistics not (every TP rank's are the whole rows'), over "dp" under FSDP 2 x TP 2.
check tp2_moe_aux 2 --model.flavor=tiny_moe "${tp2[@]}" --model.output_router_logits=true
check tp2_moe_nosp_full_ac 2 --model.flavor=tiny_moe "${tp2[@]}" \
  --parallelism.enable_sequence_parallel=false --activation_checkpoint.mode=full
check fsdp2_tp2_moe_aux 4 --model.flavor=tiny_moe "${tp2[@]}" --model.output_router_logits=true

# The comparison fails where the two differ: TP 2's report against FSDP 2's plan.
if "$python" "$compare" "$work/fsdp2.plan.json" "$work/tp2.log" > "$work/mismatch.out"; then
  echo "comm_compare.py found FSDP 2's plan equal to TP 2's counts"; cat "$work/mismatch.out"; exit 1
fi

# One process: nothing communicated, no table and no report.
"$titan" plan "${common[@]}" > "$work/one.plan"
! grep -q '^collectives per step' "$work/one.plan" || { echo "one process: a communication table"; cat "$work/one.plan"; exit 1; }
"$titan" train "${common[@]}" --job.dump_folder="$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
! grep -q '^communication per step' "$work/one.log" || { echo "one process: a communication report"; exit 1; }
echo "comm_counts: all equal"

#!/usr/bin/env bash
# `titan train` with tensor parallel on a model with experts and no expert parallel (torchtitan's
# expert tensor parallel: every TP rank holds 1/T of every expert's width -- gate and up
# column-wise, down row-wise -- and runs each sparse block on the whole rows, as a dense TP MLP;
# titan launch -> mpirun, oversubscribed, one thread a rank) on the tiny_moe flavor (8 experts, 2
# per token) with the load-balancing loss on, in fp32, against the single process's run with the
# same global batch: TP 2 (2 ranks; the sparse blocks' input all-gathered from the sequence shards,
# their output reduce-scattered), TP 2 without sequence parallel (all-reduces), FSDP 2 x TP 2 (4
# ranks: the experts' TP cuts FSDP-sharded over dp_shard) and DDP 2 x TP 2 (4 ranks):
#  - the first 10 losses (the load-balancing term included, local: every TP rank's statistics are
#    its data-parallel rank's whole rows, as the single process's micro-batches of one row) and
#    grad norms within 1e-5 relative (tests/e2e/equal_to_single.py);
#  - with a learning rate no update survives rounding (1e-30), the export is the one process's
#    file byte for byte (TP 2 with and without sequence parallel, FSDP 2 x TP 2), and from a
#    Hugging Face Qwen3-MoE folder loaded as initial weights (TP 2, FSDP 2 x TP 2);
#  - checkpoints: TP 2 saves the one process's layout, whose step-4 checkpoint resumes on one
#    process, whose step-8 checkpoint resumes on TP 2 again, each within 1e-5 of the
#    uninterrupted run; FSDP 2 x TP 2 saves too, its step-4 checkpoint resumed on TP 2.
# (titan plan for it: tests/e2e/plan_memory.sh and comm_counts.sh.)
# usage: train_moe_tensor_parallel.sh TITAN PYTHON
set -euo pipefail
titan="$1"
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/layout_runs.sh"

# At learning rate 1e-5 (layout_runs.sh says why).
common=("${tiny_moe_layouts[@]}")
tp2=(--parallelism.tensor_parallel_degree=2)
ddp2=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1)

run single 1
run tp2 2 "${tp2[@]}"
one_line "$work/tp2.log" "expert tensor parallel over the 2 TP ranks: each holds 1/2 of every expert's width"
run tp2-nosp 2 "${tp2[@]}" --parallelism.enable_sequence_parallel=false
run fsdp2tp2 4 "${tp2[@]}"
run ddp2tp2 4 "${tp2[@]}" "${ddp2[@]}"
equal_to_single single 1 tp2 tp2-nosp fsdp2tp2 ddp2tp2

# No update survives rounding: the export is the one process's initialisation, byte for byte.
still=(--training.steps=2 --optimizer.lr=1e-30)
run still-single 1 "${still[@]}"
run still-tp2 2 "${still[@]}" "${tp2[@]}"
run still-tp2-nosp 2 "${still[@]}" "${tp2[@]}" --parallelism.enable_sequence_parallel=false
run still-fsdp2tp2 4 "${still[@]}" "${tp2[@]}"
equal_to_single still-single 1 still-tp2 still-tp2-nosp still-fsdp2tp2
same_export still-single still-tp2 still-tp2-nosp still-fsdp2tp2

# A Hugging Face Qwen3-MoE folder (transformers' layout, one tensor per expert) as initial weights:
# each rank reads its TP cuts of every expert (under FSDP its rows of them).
write_tiny_qwen3_moe "$work/moe"
hf=(--model.flavor=hf --model.hf_assets_path="$work/moe" --training.dataset=files
    --training.dataset_path=/usr/share/doc/jargon-text/jargon.txt.gz
    --checkpoint.initial_load_path="$work/moe" --checkpoint.initial_load_in_hf=true)
run hf-still-single 1 "${hf[@]}" "${still[@]}"
run hf-still-tp2 2 "${hf[@]}" "${still[@]}" "${tp2[@]}"
run hf-still-fsdp2tp2 4 "${hf[@]}" "${still[@]}" "${tp2[@]}"
equal_to_single hf-still-single 1 hf-still-tp2 hf-still-fsdp2tp2
same_export hf-still-single hf-still-tp2 hf-still-fsdp2tp2

# Checkpoints: TP 2 -> one process -> TP 2; FSDP 2 x TP 2 -> TP 2.
ckpt=(--checkpoint.enable=true --checkpoint.interval=4 --checkpoint.keep_latest_k=0)
run ck-tp2 2 "${ckpt[@]}" "${tp2[@]}"
[ -f "$work/ck-tp2/checkpoint/step-4/model.safetensors" ] || { echo "ck-tp2: not the one process's layout"; ls "$work/ck-tp2/checkpoint/step-4"; exit 1; }
run tp2-to-1 1 "${ckpt[@]}" --checkpoint.initial_load_path="$work/ck-tp2/checkpoint/step-4" \
  --checkpoint.initial_load_model_only=false
run tp2-to-1-to-tp2 2 "${ckpt[@]}" "${tp2[@]}" \
  --checkpoint.initial_load_path="$work/tp2-to-1/checkpoint/step-8" \
  --checkpoint.initial_load_model_only=false
run ck-fsdp2tp2 4 "${ckpt[@]}" "${tp2[@]}"
run fsdp2tp2-to-tp2 2 "${ckpt[@]}" "${tp2[@]}" \
  --checkpoint.initial_load_path="$work/ck-fsdp2tp2/checkpoint/step-4" \
  --checkpoint.initial_load_model_only=false
equal_to_single single 1 ck-tp2 ck-fsdp2tp2
equal_to_single single 5 tp2-to-1 fsdp2tp2-to-tp2
equal_to_single single 9 tp2-to-1-to-tp2
echo "train_moe_tensor_parallel: all checks passed"

#!/usr/bin/env bash
# Training checkpoints saved under FSDP x TP x EP (the experts FSDP-sharded over the ranks holding
# them: dp_shard x tp > ep) and asynchronously under FSDP x EP (titan launch -> mpirun,
# oversubscribed, one thread a rank) on the tiny_moe flavor with the load-balancing loss on (local:
# the single process's micro-batches of one row are the ranks' rows), each save in the one
# process's layout (each tensor gathered onto rank 0: train/parallelism.h), against the
# uninterrupted single process's run with the same global batch:
#  - FSDP 2 x TP 2 x EP 2 (4 ranks) saves at step 5; it resumes as one process, as TP 2 x EP 2 and
#    as FSDP 2 x TP 2 x EP 2 (there the uninterrupted run's steps 6 to 10 bit for bit); the one
#    process's step-5 save resumes as FSDP 2 x TP 2 x EP 2;
#  - HSDP 2 x FSDP 2 x TP 2 x EP 2 (8 ranks, global batch 8) and DDP 2 x TP 2 x EP 2 (4 ranks)
#    save at step 5 and resume as one process; DDP 2 x TP 2 x EP 2's async save writes the
#    synchronous save's files byte for byte;
#  - checkpoint.async_mode = "async" under FSDP 2 x TP 2 x EP 2 and FSDP 2 x EP 2 (4 ranks, the
#    experts sharded over the 2 ranks holding them) writes the synchronous save's files byte for
#    byte (but the run's own config lines), and FSDP 2 x EP 2's async step-5 resumes as one
#    process and as FSDP 2 x EP 2 (the synchronous run's steps 6 to 10 bit for bit).
# Every run's losses and grad norms (the saving runs' from step 1, the resumed ones' from step 6)
# within 1e-5 relative of the one process's (tests/e2e/equal_to_single.py), at the learning rate
# 1e-5 of layout_runs.sh's tiny_moe_layouts (at the default 8e-4 the tiny MoE's trajectory is
# chaotic, so layouts that round differently part after a few steps). A resume that misplaced a
# weight -- an expert's FSDP row, a TP cut -- is far off; at this learning rate a lost AdamW
# moment moves the next steps by little (the experts' moments zeroed in the gather: grad norm
# 1.3e-5 off at step 7, just caught), so the resumes in the saving layout are held bit for bit.
# usage: checkpoint_expert_tensor_layouts.sh TITAN PYTHON
set -euo pipefail
titan="$1"
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/layout_runs.sh"
. "$(dirname "$0")/checkpoint_runs.sh"

common=("${tiny_moe_layouts[@]}")
tp2ep2=(--parallelism.tensor_parallel_degree=2 --parallelism.expert_parallel_degree=2)
ckpt=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.keep_latest_k=0)
async=(--checkpoint.async_mode=async)

# FSDP 2 x TP 2 x EP 2 saves; resumes as one process, TP 2 x EP 2 and itself; one process's save
# resumes as FSDP 2 x TP 2 x EP 2.
run single 1
run ck-fsdp2tp2ep2 4 "${ckpt[@]}" "${tp2ep2[@]}"
one_line "$work/ck-fsdp2tp2ep2.log" "dp_replicate 1 x dp_shard 2 .* the experts sharded over the ranks holding the same experts"
one_process_layout ck-fsdp2tp2ep2
# shellcheck disable=SC2046
run fsdp2tp2ep2-to-1 1 $(resume_from ck-fsdp2tp2ep2)
# shellcheck disable=SC2046
run fsdp2tp2ep2-to-tp2ep2 2 "${tp2ep2[@]}" $(resume_from ck-fsdp2tp2ep2)
# shellcheck disable=SC2046
run fsdp2tp2ep2-to-fsdp2tp2ep2 4 "${tp2ep2[@]}" $(resume_from ck-fsdp2tp2ep2)
run ck-single 1 "${ckpt[@]}"
# shellcheck disable=SC2046
run 1-to-fsdp2tp2ep2 4 "${tp2ep2[@]}" $(resume_from ck-single)
resumed fsdp2tp2ep2-to-1 fsdp2tp2ep2-to-tp2ep2 fsdp2tp2ep2-to-fsdp2tp2ep2 1-to-fsdp2tp2ep2
equal_to_single single 1 ck-fsdp2tp2ep2 ck-single
equal_to_single single 6 fsdp2tp2ep2-to-1 fsdp2tp2ep2-to-tp2ep2 fsdp2tp2ep2-to-fsdp2tp2ep2 1-to-fsdp2tp2ep2
same_steps_after 5 ck-fsdp2tp2ep2 fsdp2tp2ep2-to-fsdp2tp2ep2

# Asynchronous saves under FSDP 2 x TP 2 x EP 2 and FSDP 2 x EP 2: the synchronous save's files.
run async-fsdp2tp2ep2 4 "${ckpt[@]}" "${tp2ep2[@]}" "${async[@]}"
grep -q "writing in the background" "$work/async-fsdp2tp2ep2.log" || { echo "async-fsdp2tp2ep2: no background write"; cat "$work/async-fsdp2tp2ep2.log"; exit 1; }
ep2=(--parallelism.expert_parallel_degree=2)
run ck-fsdp2ep2 4 "${ckpt[@]}" "${ep2[@]}"
one_line "$work/ck-fsdp2ep2.log" "dp_replicate 1 x dp_shard 4 .* the experts sharded over the ranks holding the same experts"
run async-fsdp2ep2 4 "${ckpt[@]}" "${ep2[@]}" "${async[@]}"
grep -q "writing in the background" "$work/async-fsdp2ep2.log" || { echo "async-fsdp2ep2: no background write"; cat "$work/async-fsdp2ep2.log"; exit 1; }
for step in 5 10; do
  same_checkpoint ck-fsdp2tp2ep2/checkpoint/step-$step async-fsdp2tp2ep2/checkpoint/step-$step
  same_checkpoint ck-fsdp2ep2/checkpoint/step-$step async-fsdp2ep2/checkpoint/step-$step
done
# shellcheck disable=SC2046
run async-fsdp2ep2-to-1 1 $(resume_from async-fsdp2ep2)
# shellcheck disable=SC2046
run async-fsdp2ep2-to-fsdp2ep2 4 "${ep2[@]}" $(resume_from async-fsdp2ep2)
resumed async-fsdp2ep2-to-1 async-fsdp2ep2-to-fsdp2ep2
same_steps_after 5 ck-fsdp2ep2 async-fsdp2ep2-to-fsdp2ep2
equal_to_single single 1 async-fsdp2tp2ep2 ck-fsdp2ep2 async-fsdp2ep2
equal_to_single single 6 async-fsdp2ep2-to-1 async-fsdp2ep2-to-fsdp2ep2

# DDP 2 x TP 2 x EP 2 (4 ranks, dp_shard 1: no FSDP) saves, synchronously and
# asynchronously alike; resumes as one process.
ddp2=(--parallelism.data_parallel_replicate_degree=2)
run ck-ddp2tp2ep2 4 "${ckpt[@]}" "${tp2ep2[@]}" "${ddp2[@]}"
one_line "$work/ck-ddp2tp2ep2.log" "dp_replicate 2 x dp_shard 1 .* parameters replicated, gradients all-reduced"
one_process_layout ck-ddp2tp2ep2
run async-ddp2tp2ep2 4 "${ckpt[@]}" "${tp2ep2[@]}" "${ddp2[@]}" "${async[@]}"
for step in 5 10; do
  same_checkpoint ck-ddp2tp2ep2/checkpoint/step-$step async-ddp2tp2ep2/checkpoint/step-$step
done
# shellcheck disable=SC2046
run ddp2tp2ep2-to-1 1 $(resume_from ck-ddp2tp2ep2)
resumed ddp2tp2ep2-to-1
equal_to_single single 1 ck-ddp2tp2ep2 async-ddp2tp2ep2
equal_to_single single 6 ddp2tp2ep2-to-1

# HSDP 2 x FSDP 2 x TP 2 x EP 2 (8 ranks, global batch 8) saves; resumes as one process.
batch8=(--training.global_batch_size=8)
run single8 1 "${batch8[@]}"
run ck-hsdp2fsdp2tp2ep2 8 "${batch8[@]}" "${ckpt[@]}" "${tp2ep2[@]}" --parallelism.data_parallel_replicate_degree=2
one_line "$work/ck-hsdp2fsdp2tp2ep2.log" "dp_replicate 2 x dp_shard 2 .* the experts sharded over the ranks holding the same experts"
one_process_layout ck-hsdp2fsdp2tp2ep2
# shellcheck disable=SC2046
run hsdp2fsdp2tp2ep2-to-1 1 "${batch8[@]}" $(resume_from ck-hsdp2fsdp2tp2ep2)
resumed hsdp2fsdp2tp2ep2-to-1
equal_to_single single8 1 ck-hsdp2fsdp2tp2ep2
equal_to_single single8 6 hsdp2fsdp2tp2ep2-to-1
echo "checkpoint_expert_tensor_layouts: all checks passed"

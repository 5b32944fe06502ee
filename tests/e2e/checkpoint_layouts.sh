#!/usr/bin/env bash
# Training checkpoints saved under tensor and expert parallel with FSDP and HSDP, and
# asynchronously under TP and EP (titan launch -> mpirun, oversubscribed, one thread a rank), each
# save in the one process's layout (gathered onto rank 0: train/parallelism.h), against the
# uninterrupted single process's run with the same global batch:
#  - FSDP 2 x TP 2 (4 ranks) saves at step 5; it resumes as TP 2, as one process and as FSDP 2 x
#    TP 2; HSDP 2 x FSDP 2 x TP 2 (8 ranks) saves at step 5 and resumes as one process;
#  - checkpoint.async_mode = "async" under TP 2, FSDP 2 x TP 2 and EP 2 (tiny_moe) writes the
#    synchronous save's files byte for byte (job_config.toml but its async_mode line,
#    trainer_state.json but that file's checksum), and TP 2's and EP 2's async step-5 resumes as
#    one process; a synchronous save adds less than the state's bytes to the run's peak (one tensor
#    gathered on rank 0 at a time), an asynchronous one at least them (rank 0's kept copy);
#  - HSDP 2 x FSDP 2 x EP 2 (8 ranks, tiny_moe) saves at step 5 and resumes as one process.
# Every run's losses and grad norms (the saving runs' from step 1, the resumed ones' from step 6)
# within 1e-5 relative of the one process's (tests/e2e/equal_to_single.py): the tolerance the
# uninterrupted TP, FSDP and EP runs are held to, since their sums run in another order than one
# process's (TP's partial sums, FSDP's reduce-scatters, EP's rows per rank; measured up to 2.3e-6),
# while a resume that lost or misplaced part of the state -- a TP cut, an FSDP row, an AdamW
# moment -- changes the next update itself, not only its rounding.
# usage: checkpoint_layouts.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# run, equal_to_single; the MPI environment.
. "$(dirname "$0")/layout_runs.sh"
. "$(dirname "$0")/checkpoint_runs.sh"

dense=(--training.steps=10 --training.seq_len=64 --training.local_batch_size=1
       --training.global_batch_size=4 --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
       --checkpoint.last_save_in_hf=true --threads 1)
# The load-balancing loss local: the single process accumulates micro-batches of one row, which
# the ranks' rows are (the global form: train_router_aux_global.sh).
moe=("${dense[@]}" --model.flavor=tiny_moe --model.output_router_logits=true
     --model.router_aux_loss_scope=local)
tp2=(--parallelism.tensor_parallel_degree=2)
ep2=(--parallelism.expert_parallel_degree=2)
hsdp2=(--parallelism.data_parallel_replicate_degree=2)
ckpt=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.keep_latest_k=0)
async=(--checkpoint.async_mode=async)

common=()  # each run names its flags (dense or moe)

# Dense (the default tiny Qwen3): FSDP 2 x TP 2 and HSDP 2 x FSDP 2 x TP 2 save; resumes.
run single 1 "${dense[@]}"
run ck-fsdp2tp2 4 "${dense[@]}" "${ckpt[@]}" "${tp2[@]}"
grep -q "dp_replicate 1 x dp_shard 2" "$work/ck-fsdp2tp2.log" || { echo "ck-fsdp2tp2: not FSDP 2"; cat "$work/ck-fsdp2tp2.log"; exit 1; }
one_process_layout ck-fsdp2tp2
# shellcheck disable=SC2046
run fsdp2tp2-to-tp2 2 "${dense[@]}" "${tp2[@]}" $(resume_from ck-fsdp2tp2)
# shellcheck disable=SC2046
run fsdp2tp2-to-1 1 "${dense[@]}" $(resume_from ck-fsdp2tp2)
# shellcheck disable=SC2046
run fsdp2tp2-to-fsdp2tp2 4 "${dense[@]}" "${tp2[@]}" $(resume_from ck-fsdp2tp2)
resumed fsdp2tp2-to-tp2 fsdp2tp2-to-1 fsdp2tp2-to-fsdp2tp2
run ck-hsdp2fsdp2tp2 8 "${dense[@]}" "${ckpt[@]}" "${tp2[@]}" "${hsdp2[@]}"
grep -q "dp_replicate 2 x dp_shard 2" "$work/ck-hsdp2fsdp2tp2.log" || { echo "ck-hsdp2fsdp2tp2: not HSDP 2 x 2"; cat "$work/ck-hsdp2fsdp2tp2.log"; exit 1; }
one_process_layout ck-hsdp2fsdp2tp2
# shellcheck disable=SC2046
run hsdp2fsdp2tp2-to-1 1 "${dense[@]}" $(resume_from ck-hsdp2fsdp2tp2)
equal_to_single single 1 ck-fsdp2tp2 ck-hsdp2fsdp2tp2
equal_to_single single 6 fsdp2tp2-to-tp2 fsdp2tp2-to-1 fsdp2tp2-to-fsdp2tp2 hsdp2fsdp2tp2-to-1

# Asynchronous saves under TP 2 and FSDP 2 x TP 2: the synchronous save's files.
run ck-tp2 2 "${dense[@]}" "${ckpt[@]}" "${tp2[@]}"
run async-tp2 2 "${dense[@]}" "${ckpt[@]}" "${tp2[@]}" "${async[@]}"
grep -q "writing in the background" "$work/async-tp2.log" || { echo "async-tp2: no background write"; cat "$work/async-tp2.log"; exit 1; }
run async-fsdp2tp2 4 "${dense[@]}" "${ckpt[@]}" "${tp2[@]}" "${async[@]}"
for step in 5 10; do
  same_checkpoint ck-tp2/checkpoint/step-$step async-tp2/checkpoint/step-$step
  same_checkpoint ck-fsdp2tp2/checkpoint/step-$step async-fsdp2tp2/checkpoint/step-$step
done
# A synchronous save holds one tensor gathered on rank 0 at a time, never the whole state: what the
# step-5 save adds to the run's peak (the metrics' maximum over ranks: step 6's against step 5's)
# stays below the state's bytes (the step-5 files), while an asynchronous save's kept copy adds them.
"$python" - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
def added(name):
    peaks = {r["step"]: r["memory_peak_gib"] * 2**30 for r in map(json.loads, open(f"{work}/{name}.jsonl")) if "loss" in r}
    return peaks[6] - peaks[5]
for sync, copy in (("ck-tp2", "async-tp2"), ("ck-fsdp2tp2", "async-fsdp2tp2")):
    state = sum(os.path.getsize(f"{work}/{sync}/checkpoint/step-5/{f}") for f in ("model.safetensors", "optimizer.safetensors"))
    assert added(sync) < state, f"{sync}: the save added {added(sync):.0f} bytes, the whole state is {state}"
    assert added(copy) >= state, f"{copy}: the save added {added(copy):.0f} bytes, the whole state is {state}"
    print(f"{sync}: the save added {added(sync) / 2**20:.1f} MiB to the peak, {copy} {added(copy) / 2**20:.1f} MiB; the state is {state / 2**20:.1f} MiB")
PY
# shellcheck disable=SC2046
run async-tp2-to-1 1 "${dense[@]}" $(resume_from async-tp2)
equal_to_single single 1 ck-tp2 async-tp2 async-fsdp2tp2
equal_to_single single 6 async-tp2-to-1

# Experts (tiny_moe): EP 2 asynchronously; HSDP 2 x FSDP 2 x EP 2 (global batch 8).
run moe-single 1 "${moe[@]}"
run ck-ep2 2 "${moe[@]}" "${ckpt[@]}" "${ep2[@]}"
run async-ep2 2 "${moe[@]}" "${ckpt[@]}" "${ep2[@]}" "${async[@]}"
for step in 5 10; do same_checkpoint ck-ep2/checkpoint/step-$step async-ep2/checkpoint/step-$step; done
# shellcheck disable=SC2046
run async-ep2-to-1 1 "${moe[@]}" $(resume_from async-ep2)
equal_to_single moe-single 1 ck-ep2 async-ep2
equal_to_single moe-single 6 async-ep2-to-1
run moe-single8 1 "${moe[@]}" --training.global_batch_size=8
run ck-hsdp2fsdp2ep2 8 "${moe[@]}" --training.global_batch_size=8 "${ckpt[@]}" "${ep2[@]}" "${hsdp2[@]}"
grep -q "dp_replicate 2 x dp_shard 4 .* the experts sharded over the ranks holding the same experts" "$work/ck-hsdp2fsdp2ep2.log" \
  || { echo "ck-hsdp2fsdp2ep2: not HSDP 2 x FSDP 2 x EP 2"; cat "$work/ck-hsdp2fsdp2ep2.log"; exit 1; }
one_process_layout ck-hsdp2fsdp2ep2
# shellcheck disable=SC2046
run hsdp2fsdp2ep2-to-1 1 "${moe[@]}" --training.global_batch_size=8 $(resume_from ck-hsdp2fsdp2ep2)
equal_to_single moe-single8 1 ck-hsdp2fsdp2ep2
equal_to_single moe-single8 6 hsdp2fsdp2ep2-to-1

echo "checkpoint_layouts: all checks passed"

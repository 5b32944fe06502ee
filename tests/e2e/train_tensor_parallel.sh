#!/usr/bin/env bash
# `titan train` with tensor parallel (titan launch -> mpirun, oversubscribed, one thread a rank),
# with sequence parallel (torchtitan's default) unless said: TP 2 with and without it on the
# default tiny Qwen3 and on tiny Llama (tied embedding,
# Llama 3 RoPE) and Qwen2 (untied, q/k/v biases) folders loaded as initial weights, FSDP 2 x TP 2
# and HSDP 2 x TP 2 (8 ranks) on the tiny Qwen3, each against the single process's run with the
# same global batch:
#  - the first 10 losses and grad norms within 1e-5 relative; the trained exports have the one
#    process's tensors and shapes (their largest difference printed: the float sums run in
#    another order, and AdamW moves an element whose summed gradient nearly cancels by up to lr
#    either way, as tests/e2e/train_data_parallel.sh notes for the embedding);
#  - with a learning rate no update survives rounding (1e-30), the export is the one process's
#    file byte for byte: each rank's cut of the initialisation (Qwen3) or of the HF folder
#    (Llama, Qwen2), gathered back whole by the export.
#  - checkpoints: TP 2 and DDP 2 x TP 2 save the one process's layout (gathered onto rank 0),
#    and a step-4 checkpoint of TP 2 resumes on one process, one of one process on TP 2 and on
#    FSDP 2 x TP 2, each continuing within 1e-5 relative of the uninterrupted single process.
# Bad input gets one line: a seq_len the TP degree does not divide under sequence parallel.
# usage: train_tensor_parallel.sh TITAN PYTHON
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# run, equal_to_single, same_export; the MPI environment.
. "$(dirname "$0")/layout_runs.sh"
source "$(dirname "$0")/tree_sum.sh"
tokenizer="$(cd "$(dirname "$0")/../fixtures/qwen3-tokenizer" && pwd)"

common=(--training.steps=10 --training.seq_len=64 --training.local_batch_size=1
        --training.global_batch_size=4 --lr_scheduler.warmup_steps=2 --metrics.log_freq=1
        --threads 1)
tp() { echo --parallelism.tensor_parallel_degree="$1"; }
no_sp=(--parallelism.enable_sequence_parallel=false)

# run_counted NAME NPROC ARGS...: run (layout_runs.sh), and the log's step lines are rank 0's
# only: 10, or 2 (the still runs).
run_counted() {
  run "$@"
  local steps
  steps=$(grep -c '^step ' "$work/$1.log" || true)
  [ "$steps" = 10 ] || [ "$steps" = 2 ] || { echo "$1: expected 10 (or 2) step lines from rank 0 only"; cat "$work/$1.log"; exit 1; }
}
still=(--training.steps=2 --optimizer.lr=1e-30)

# The default tiny Qwen3 from scratch: each TP rank initialised with its cut of the one process's
# initial weights.
run_counted single 1
run_counted tp2 2 $(tp 2)
grep -q "tensor parallel over 2 ranks per model .*sequence parallel .* tp 0 of 2" "$work/tp2.log" || { echo "tp2: no mesh line"; cat "$work/tp2.log"; exit 1; }
run_counted tp2-no-sp 2 $(tp 2) "${no_sp[@]}"
grep -q "partial outputs all-reduced (enable_sequence_parallel = false)" "$work/tp2-no-sp.log" || { echo "tp2-no-sp: no mesh line"; cat "$work/tp2-no-sp.log"; exit 1; }
run_counted fsdp2tp2 4 $(tp 2)
grep -q "data parallel over 2 ranks: dp_replicate 1 x dp_shard 2" "$work/fsdp2tp2.log" || { echo "fsdp2tp2: not FSDP 2"; cat "$work/fsdp2tp2.log"; exit 1; }
run_counted hsdp2x2tp2 8 $(tp 2) --parallelism.data_parallel_replicate_degree=2
grep -q "dp_replicate 2 x dp_shard 2" "$work/hsdp2x2tp2.log" || { echo "hsdp2x2tp2: not HSDP 2 x 2"; cat "$work/hsdp2x2tp2.log"; exit 1; }
equal_to_single single 1 tp2 tp2-no-sp fsdp2tp2 hsdp2x2tp2
run_counted still-single 1 "${still[@]}"
run_counted still-tp2 2 "${still[@]}" $(tp 2)
run_counted still-fsdp2tp2 4 "${still[@]}" $(tp 2)
equal_to_single still-single 1 still-tp2 still-fsdp2tp2
same_export still-single still-tp2 still-fsdp2tp2

# Checkpoints at step 4, resumed on the other layout.
ckpt=(--checkpoint.enable=true --checkpoint.interval=4 --checkpoint.keep_latest_k=0)
resume() { echo --checkpoint.initial_load_path="$work/$1/checkpoint/step-4" --checkpoint.initial_load_model_only=false; }
run_counted ck-single 1 "${ckpt[@]}"
run_counted ck-tp2 2 "${ckpt[@]}" $(tp 2)
run_counted ck-ddp2tp2 4 "${ckpt[@]}" $(tp 2) --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1
equal_to_single single 1 ck-tp2 ck-ddp2tp2
[ -f "$work/ck-tp2/checkpoint/step-4/model.safetensors" ] || { echo "ck-tp2: not the one process's layout"; ls "$work/ck-tp2/checkpoint/step-4"; exit 1; }
"$titan" train "${common[@]}" $(resume ck-tp2) --job.dump_folder="$work/tp2-to-1" \
  --metrics.save_jsonl="$work/tp2-to-1.jsonl" > "$work/tp2-to-1.log" 2>&1 || { cat "$work/tp2-to-1.log"; exit 1; }
"$titan" launch --nproc 2 train "${common[@]}" $(tp 2) $(resume ck-single) --job.dump_folder="$work/1-to-tp2" \
  --metrics.save_jsonl="$work/1-to-tp2.jsonl" > "$work/1-to-tp2.log" 2>&1 || { cat "$work/1-to-tp2.log"; exit 1; }
"$titan" launch --nproc 4 train "${common[@]}" $(tp 2) $(resume ck-single) --job.dump_folder="$work/1-to-fsdp2tp2" \
  --metrics.save_jsonl="$work/1-to-fsdp2tp2.jsonl" > "$work/1-to-fsdp2tp2.log" 2>&1 || { cat "$work/1-to-fsdp2tp2.log"; exit 1; }
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def records(name):
    return {r["step"]: r for r in map(json.loads, open(f"{work}/{name}.jsonl")) if "loss" in r}
single = records("single")
for name in ("ck-single", "ck-tp2"):
    run = records(name)
    assert sorted(run) == sorted(single), f"{name}: steps {sorted(run)}"
for name in ("tp2-to-1", "1-to-tp2", "1-to-fsdp2tp2"):
    run = records(name)
    assert sorted(run) == list(range(5, 11)), f"{name}: steps {sorted(run)}"
    worst = 0.0
    for step, r in run.items():
        for key in ("loss", "grad_norm"):
            rel = abs(r[key] - single[step][key]) / abs(single[step][key])
            worst = max(worst, rel)
            assert rel <= 1e-5, f"{name} step {step} {key}: {r[key]} vs {single[step][key]} ({rel:.2e})"
    print(f"{name}: resumed at step 5, losses and grad norms within {worst:.1e} relative of one process")
PY

# Llama (tied) and Qwen2 (untied, biases) folders, loaded into each rank's cuts.
"$python" "$(dirname "$0")/write_tiny_llama_qwen2.py" "$work" "$tokenizer" 0.02
corpus=/usr/share/doc/jargon-text/jargon.txt.gz
for name in llama qwen2; do
  hf=(--preset hf --model.hf_assets_path="$work/$name" --training.dataset=files
      --training.dataset_path="$corpus" --checkpoint.initial_load_path="$work/$name"
      --checkpoint.initial_load_in_hf=true --checkpoint.last_save_in_hf=true)
  run_counted "$name-single" 1 "${hf[@]}"
  run_counted "$name-tp2" 2 "${hf[@]}" $(tp 2)
  equal_to_single "$name-single" 1 "$name-tp2"
  run_counted "$name-still-single" 1 "${hf[@]}" "${still[@]}"
  run_counted "$name-still-tp2" 2 "${hf[@]}" "${still[@]}" $(tp 2)
  run_counted "$name-still-fsdp2tp2" 4 "${hf[@]}" "${still[@]}" $(tp 2)
  same_export "$name-still-single" "$name-still-tp2" "$name-still-fsdp2tp2"
done

# Bad input: one line each.
expect_refusal sequence-parallel "training.seq_len 63 under parallelism.tensor_parallel_degree 2 with parallelism.enable_sequence_parallel = true: each rank holds seq_len / 2 tokens of a sequence, so the degree must divide it \(or set enable_sequence_parallel = false\)$" \
  "$titan" train "${common[@]}" --training.seq_len=63 --parallelism.tensor_parallel_degree=2 --job.dump_folder="$work/sp"
echo "train_tensor_parallel: all checks passed"

#!/usr/bin/env bash
# Weights holding NaN or Inf are found at load, named (file, first tensor, counts) and refused
# with one line by every command that loads them -- generate and eval (fp32 and bf16), convert,
# train's initial weights and a resumed checkpoint -- unless explicitly allowed for debugging;
# nothing on disk changes. Weights a run made non-finite are not exported (one process, and FSDP 2
# with the same line: the shards scanned, their counts summed).
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/tree_sum.sh"
common=(--training.steps=2 --lr_scheduler.warmup_steps=0 --training.seq_len=64
        --training.local_batch_size=2 --threads 2)

# poison FILE TENSOR VALUE...: overwrite the first values of an F32 tensor in a safetensors file.
poison() { python3 - "$@" <<'PY'
import json, struct, sys
path, name, values = sys.argv[1], sys.argv[2], [float(v) for v in sys.argv[3:]]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    entry = json.loads(f.read(n))[name]
    assert entry["dtype"] == "F32", entry
    f.seek(8 + n + entry["data_offsets"][0])
    f.write(struct.pack("<%df" % len(values), *values))
PY
}

"$titan" train "${common[@]}" --checkpoint.enable=true --checkpoint.last_save_model_only=false \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/run" > "$work/run.log"
# A matmul weight, which bf16 inference loads straight into bf16 and never holds in fp32.
cp -r "$work/run/hf" "$work/matmul"
poison "$work/matmul/model.safetensors" model.layers.0.self_attn.q_proj.weight nan
poison "$work/run/hf/model.safetensors" model.norm.weight nan inf -inf
poison "$work/run/checkpoint/step-2/model.safetensors" model.layers.1.mlp.up_proj.weight nan
# The edits no longer match the checksums the save and the exports recorded, which would refuse
# the checkpoint and the folders first (tests/e2e/train_checkpoint_checksums.sh); without the
# checksums (saved before them) the NaN scan behind them is what refuses them.
for meta in "$work/run/checkpoint/step-2/trainer_state.json" "$work/run/hf/titan.json" "$work/matmul/titan.json"; do
python3 - "$meta" <<'PY'
import json, sys
state = json.load(open(sys.argv[1]))
del state["checksums"]
json.dump(state, open(sys.argv[1], "w"), indent=2)
PY
done
printf '{"text": "one two three four five six seven eight nine ten"}\n' > "$work/data.jsonl"
tree_sum "$work" > "$work.before"
same() { tree_sum "$work" | grep -v -e "\.out$" -e "\.err$" | diff <(grep -v -e "\.out$" -e "\.err$" "$work.before") - > /dev/null \
  || { echo "$1: something changed"; exit 1; }; }
named='3 non-finite weight\(s\) \(NaN or Inf\) in 1 tensor\(s\), the first "model.norm.weight" with 3; .*--allow-nonfinite-weights'

expect_refusal generate "^titan generate: error: .*/run/hf/model.safetensors: $named" \
  "$titan" generate --model "$work/run/hf" --prompt hi --max-new-tokens 2
same generate
expect_refusal generate_bf16 "^titan generate: error: .*/run/hf/model.safetensors: $named" \
  "$titan" generate --model "$work/run/hf" --dtype bfloat16 --prompt hi --max-new-tokens 2
same generate_bf16
expect_refusal generate_bf16_matmul "^titan generate: error: .*/matmul/model.safetensors: 1 non-finite weight\(s\) .* the first \"model.layers.0.self_attn.q_proj.weight\" with 1; .*--allow-nonfinite-weights" \
  "$titan" generate --model "$work/matmul" --dtype bfloat16 --prompt hi --max-new-tokens 2
same generate_bf16_matmul
expect_refusal eval "^titan eval: error: .*/run/hf/model.safetensors: $named" \
  "$titan" eval --model "$work/run/hf" --data "$work/data.jsonl" --seq-len 8
same eval
expect_refusal eval_bf16_matmul "^titan eval: error: .*/matmul/model.safetensors: 1 non-finite weight\(s\) .* the first \"model.layers.0.self_attn.q_proj.weight\" with 1; .*--allow-nonfinite-weights" \
  "$titan" eval --model "$work/matmul" --dtype bfloat16 --data "$work/data.jsonl" --seq-len 8
same eval_bf16_matmul
expect_refusal convert "^titan convert: error: .*/run/hf/model.safetensors: $named" \
  "$titan" convert "$work/run/hf" "$work/bf16" --dtype bfloat16
same convert
expect_refusal train_initial "^titan train: error: .*/run/hf/model.safetensors: $named" \
  "$titan" train "${common[@]}" --checkpoint.initial_load_path="$work/run/hf" \
  --checkpoint.initial_load_in_hf=true --job.dump_folder="$work/b"
! grep -q "^step" "$work/train_initial.out" || { echo "training started"; exit 1; }
rm -rf "$work/b"
same train_initial
expect_refusal resume "^titan train: error: .*/run/checkpoint/step-2/model.safetensors: 1 non-finite weight\(s\) .* the first \"model.layers.1.mlp.up_proj.weight\" with 1; .*checkpoint.allow_nonfinite_weights" \
  "$titan" train "${common[@]}" --training.steps=4 --checkpoint.enable=true --checkpoint.last_save_in_hf=false \
  --job.dump_folder="$work/run"
same resume

# Weights that training itself made non-finite (an lr that overflows fp32, every later step
# skipped) are not exported as a model.
if "$titan" train "${common[@]}" --optimizer.lr=1e39 --training.skip_nonfinite_steps=true \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/blowup" > "$work/blowup.out" 2> "$work/blowup.err"; then
  echo "training that made its weights non-finite exported them"; exit 1
fi
tail -n 1 "$work/blowup.err" | grep -qE "^titan train: error: the trained model: [0-9]+ non-finite weight" \
  || { echo "trained export: unexpected error"; cat "$work/blowup.err"; exit 1; }
[ ! -e "$work/blowup/hf" ] || { echo "a non-finite model was exported"; exit 1; }
# Under FSDP 2 each rank scans its shards and the counts are summed over the shard group: the same
# line as one process's (the same global batch), and nothing exported.
. "$(dirname "$0")/mpi_env.sh"
if "$titan" launch --nproc 2 train "${common[@]}" --optimizer.lr=1e39 \
  --training.skip_nonfinite_steps=true --training.global_batch_size=4 \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$work/blowup2" > "$work/blowup2.out" 2>&1; then
  echo "FSDP 2: training that made its weights non-finite exported them"; exit 1
fi
"$titan" train "${common[@]}" --optimizer.lr=1e39 --training.skip_nonfinite_steps=true \
  --training.global_batch_size=4 --checkpoint.last_save_in_hf=true \
  --job.dump_folder="$work/blowup1" > /dev/null 2> "$work/blowup1.err" && exit 1
want=$(tail -n 1 "$work/blowup1.err" | sed 's/^titan train: error: //')
grep -qF "[rank 0 of 2] titan train: error: $want" "$work/blowup2.out" \
  || { echo "FSDP 2: not one process's line: $want"; cat "$work/blowup2.out"; exit 1; }
[ ! -e "$work/blowup2/hf" ] || { echo "FSDP 2: a non-finite model was exported"; exit 1; }
rm -rf "$work/blowup" "$work/blowup.out" "$work/blowup.err" "$work/blowup1" "$work/blowup2"

# Allowed, for debugging: loaded with a warning.
"$titan" generate --model "$work/run/hf" --prompt hi --max-new-tokens 2 --greedy --allow-nonfinite-weights \
  > "$work/allowed.out" 2> "$work/allowed.err"
grep -q "^warning: .*model.norm.weight.*loaded anyway" "$work/allowed.err" || { echo "no warning"; cat "$work/allowed.err"; exit 1; }
cat "$work"/generate.err "$work"/resume.err

#!/usr/bin/env bash
# bf16 mixed precision in `titan train` (training.mixed_precision_param = "bfloat16"):
#  1. the start-up log says what the matmuls compute in;
#  2. a resumed bf16 run equals the uninterrupted one bit for bit (the checkpoint holds the fp32
#     master weights and AdamW state; the bf16 copies are remade from them), dense and MoE;
#  3. the checkpoint's weights are fp32;
#  4. `titan eval --dtype bfloat16` computes what a bf16 run's validation pass computes.
# The loss curve against fp32 is train_bf16_curve.sh.
set -euo pipefail
titan=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1 and 2. Resume under bf16, as tests/e2e/train_resume.sh does in fp32.
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["step"] >= 3: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"; }
for flavor in tiny tiny_moe; do
  run="$work/resume_$flavor"
  common=(--model.flavor="$flavor" --training.mixed_precision_param=bfloat16 --training.steps=6
          --lr_scheduler.warmup_steps=2 --training.seq_len=64 --training.local_batch_size=2
          --metrics.log_freq=1 --checkpoint.enable=true --checkpoint.interval=2
          --checkpoint.keep_latest_k=0 --checkpoint.last_save_in_hf=false --job.dump_folder="$run"
          --threads 2)
  "$titan" train "${common[@]}" --metrics.save_jsonl="$run.full.jsonl" > "$run.full.log"
  rm -rf "$run/checkpoint/step-4" "$run/checkpoint/step-6"
  "$titan" train "${common[@]}" --metrics.save_jsonl="$run.resumed.jsonl" > "$run.resumed.log"
  grep -q "mixed precision: matmuls in bf16" "$run.full.log" || { echo "$flavor: no bf16 start-up line"; cat "$run.full.log"; exit 1; }
  grep -q "resumed step 2 from" "$run.resumed.log" || { echo "$flavor: did not resume"; cat "$run.resumed.log"; exit 1; }
  diff <(losses "$run.full.jsonl") <(losses "$run.resumed.jsonl") || { echo "$flavor: resumed bf16 losses differ"; exit 1; }
  [ "$(losses "$run.full.jsonl" | wc -l)" = 4 ] || { echo "$flavor: expected 4 compared steps"; exit 1; }
done

# A bf16 run's validation pass computes what `titan eval --dtype bfloat16` computes on its
# (fp32) export, to the 6 decimals eval prints; eval says on stderr what the loaded model's matmuls
# compute in. (Its two losses are not compared with each other: their difference is the sum of
# many bf16 roundings, 3e-5 in one build's 20-step model and under 1e-6 in another's.)
corpus=/usr/share/doc/jargon-text/jargon.txt.gz
"$titan" train --training.mixed_precision_param=bfloat16 --training.steps=20 --training.seq_len=128 \
  --lr_scheduler.warmup_steps=2 --validation.enable=true --validation.dataset_path="$corpus" \
  --validation.freq=20 --validation.steps=3 --metrics.save_jsonl="$work/val.jsonl" \
  --job.dump_folder="$work/val" --threads 2 > "$work/val.log"
validation=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "validation_loss" in r: print("%.6f" % r["validation_loss"])' "$work/val.jsonl")
evaluate() { "$titan" eval --model "$work/val/hf" --data "$corpus" --seq-len 128 --batch-size 8 \
  --max-batches 3 --threads 2 --dtype "$1" 2> "$work/eval_$1.err" | awk '{printf "%.6f", $2}'; }
eval_bf16=$(evaluate bfloat16)
eval_fp32=$(evaluate float32)
echo "bf16 run: validation loss $validation, eval --dtype bfloat16 $eval_bf16, float32 $eval_fp32"
[ -n "$validation" ] && [ "$validation" = "$eval_bf16" ] || { echo "bf16 eval and validation disagree"; exit 1; }
grep -qx "precision: matmuls in bf16 with fp32 accumulation, the rest in fp32" "$work/eval_bfloat16.err" \
  || { echo "eval --dtype bfloat16 does not compute in bf16:"; cat "$work/eval_bfloat16.err"; exit 1; }
grep -qx "precision: fp32 throughout" "$work/eval_float32.err" \
  || { echo "eval --dtype float32 does not compute in fp32:"; cat "$work/eval_float32.err"; exit 1; }
"$titan" eval --model "$work/val/hf" --data "$corpus" --dtype float16 > "$work/bad.log" 2>&1 && { echo "--dtype float16 accepted"; exit 1; }
[ "$(wc -l < "$work/bad.log")" = 1 ] && grep -q "float16" "$work/bad.log" || { echo "bad --dtype message:"; cat "$work/bad.log"; exit 1; }

# 3. The checkpoint keeps fp32 master weights.
python3 - "$work/resume_tiny/checkpoint/step-2/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
assert dtypes == {"F32"}, f"checkpoint weights are {dtypes}, not F32 master weights"
PY
echo "bf16: resumed runs identical (tiny, tiny_moe); fp32 master weights in the checkpoint; eval --dtype bfloat16 equals the bf16 validation"

#!/usr/bin/env bash
# A titan step-N checkpoint is a model for every command: titan info describes it, titan convert
# exports it as a Hugging Face folder that Transformers loads with the same logits as the run's own
# export, titan eval and generate read it and give what they give on that export. A torchtitan DCP
# checkpoint is refused by every command in one line naming torchtitan's conversion.
set -euo pipefail
titan=$(realpath "$1")
python="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }

# The last step is saved with its optimizer state (full) and exported in fp32: the same weights.
"$titan" train --training.steps=3 --lr_scheduler.warmup_steps=1 --training.seq_len=64 --training.local_batch_size=2 \
  --checkpoint.enable=true --checkpoint.last_save_model_only=false --checkpoint.export_dtype=float32 \
  --threads 2 --job.dump_folder="$work/run" > "$work/train.log" 2>&1 || fail "training failed" "$work/train.log"
step="$work/run/checkpoint/step-3"

"$titan" info "$step" > "$work/info.out" 2> "$work/info.err" || fail "titan info refused the checkpoint" "$work/info.err"
grep -q "^checkpoint    $step: titan training checkpoint of step 3, with its optimizer state$" "$work/info.out" \
  || fail "titan info does not name the checkpoint" "$work/info.out"
grep -q "^architecture  Qwen3ForCausalLM$" "$work/info.out" || fail "titan info lacks the model" "$work/info.out"

"$titan" convert "$step" "$work/converted" > "$work/convert.out" 2>&1 || fail "titan convert refused the checkpoint" "$work/convert.out"
for f in config.json generation_config.json tokenizer.json job_config.toml model.safetensors; do
  [ -f "$work/converted/$f" ] || fail "the converted folder lacks $f" "$work/convert.out"
done
"$python" - "$work/converted" "$work/run/hf" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM
a, b = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for d in sys.argv[1:])
ids = torch.tensor([[1, 5, 9, 200, 7, 3]])
with torch.no_grad():
    la, lb = a(ids).logits, b(ids).logits
assert torch.equal(la, lb), f"logits differ by {(la - lb).abs().max()}"
print("the converted checkpoint equals the run's export in Transformers")
PY

printf '%s\n' '{"text": "The hacker ethic holds that information wants to be free."}' > "$work/data.jsonl"
"$titan" eval --model "$step" --data "$work/data.jsonl" --seq-len 8 --threads 2 > "$work/eval_ckpt.out" 2> "$work/eval_ckpt.err" \
  || fail "titan eval refused the checkpoint" "$work/eval_ckpt.err"
"$titan" eval --model "$work/run/hf" --data "$work/data.jsonl" --seq-len 8 --threads 2 > "$work/eval_hf.out" 2> /dev/null
cmp -s "$work/eval_ckpt.out" "$work/eval_hf.out" || { diff "$work/eval_ckpt.out" "$work/eval_hf.out"; fail "eval differs"; }
"$titan" generate --model "$step" --prompt "The" --greedy --max-new-tokens 8 --threads 2 > "$work/gen_ckpt.out" 2> "$work/gen_ckpt.err" \
  || fail "titan generate refused the checkpoint" "$work/gen_ckpt.err"
"$titan" generate --model "$work/run/hf" --prompt "The" --greedy --max-new-tokens 8 --threads 2 > "$work/gen_hf.out" 2> /dev/null
cmp -s "$work/gen_ckpt.out" "$work/gen_hf.out" || { diff "$work/gen_ckpt.out" "$work/gen_hf.out"; fail "generate differs"; }
[ -z "$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'titan-checkpoint-*' -newer "$work/train.log" 2> /dev/null)" ] \
  || fail "a temporary export was left behind"

# torchtitan's DCP layout: refused by each command in one line.
mkdir "$work/dcp" && touch "$work/dcp/.metadata" "$work/dcp/__0_0.distcp"
for cmd in "info $work/dcp" "convert $work/dcp $work/out" "eval --model $work/dcp --data $work/data.jsonl" \
           "generate --model $work/dcp --prompt hi"; do
  if "$titan" $cmd > "$work/dcp.out" 2> "$work/dcp.err"; then fail "titan $cmd accepted a DCP checkpoint"; fi
  [ "$(wc -l < "$work/dcp.err")" = 1 ] || fail "titan $cmd: not one line" "$work/dcp.err"
  grep -q "is a torchtitan DCP checkpoint (.metadata, __0_0.distcp), which titan does not read: export it as a Hugging Face folder with torchtitan's scripts/checkpoint_conversion/convert_to_hf.py" "$work/dcp.err" \
    || fail "titan $cmd: unclear refusal" "$work/dcp.err"
done
[ ! -e "$work/out" ] || fail "convert wrote something for a DCP checkpoint"
echo ok
